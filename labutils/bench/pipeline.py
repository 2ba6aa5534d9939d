"""Benchmark ``pipeline``: measured bubbles against (p-1)/(m+p-1)."""
from labutils.bench.suite import Row
from labutils.core.timing import Stats
from labutils.cost.step_time import bubble_fraction as predicted_bubble
from labutils.experiments.pipeline_bubble import measured_bubble, timed_pipeline


def run(quick=False):
    """Bubble measured from the timeline of a balanced pipeline vs (p-1)/(m+p-1).

    One sleeping layer per stage, 8 samples per micro-batch: 32 ms forward, 64 ms backward.
    Sleep leaves the cores free, so p ranks on 2 cores do not compete, and the work is equal on
    every stage. What the formula leaves out only adds idle time: each hop's send/recv and the
    wake-up of a sleeping rank (about 1 ms idle, up to ~10 ms on a loaded 2-core machine) on
    each of the m + p - 1 slots of 96 ms on the critical path, plus sleeps overshooting
    unevenly. Target: the median within [formula - 0.03, formula + 0.10]. A pipeline that did
    not overlap its stages would measure (p-1)/p, far outside.
    """
    rows = []
    for schedule in ("gpipe", "1f1b"):
        for p, m in ((2, 4), (4, 4), (4, 8)):
            values = [measured_bubble(timed_pipeline(p, m, schedule, batch_size=8 * m,
                                                     n_layers=p, ms_per_sample=4.0))
                      for _ in range(1 if quick else 5)]
            predicted = predicted_bubble(p, m)
            rows.append(Row("pipeline", f"{schedule} bubble, p={p}, m={m}", Stats.of(values),
                            "fraction", f"predicted {predicted:.3f}; target "
                            f"{predicted - 0.03:.3f}-{predicted + 0.10:.3f}"))
    return rows
