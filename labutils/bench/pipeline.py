"""Benchmark ``pipeline``: measured bubbles against (p-1)/(m+p-1), stage compute emulated."""
from labutils.bench.suite import Row
from labutils.experiments.pipeline_bubble import measure_bubbles


def run(quick=False):
    """Bubble of a balanced pipeline whose stages sleep (emulated compute: 24 ms forward and
    48 ms backward per micro-batch), read from the ops' timelines, vs (p-1)/(m+p-1).

    What the formula leaves out only adds idle time: the gap before each op (its message,
    waking a sleeping rank, Python), paid twice per slot of 72 ms on the critical path; the
    row's note gives the mean gap, the gap the 10% target allows (``gap_allowed``: 0.46 ms at
    p = 2, m = 8, the tightest) and the bubble the formula predicts with the mean gap. A
    pipeline that did not overlap its stages would measure (p-1)/p, far outside.
    """
    rows = []
    for r in measure_bubbles(repeats=2 if quick else 5, stage_forward_ms=24.0):
        mean_gap_ms = 1e3 * sum(r["gap"].values) / r["gap"].n
        rows.append(Row("pipeline", f"{r['schedule']} bubble, p={r['p']}, m={r['m']}",
                        r["bubble"], "fraction",
                        f"predicted {r['predicted']:.3f}, target "
                        f"{0.9 * r['predicted']:.3f}-{1.1 * r['predicted']:.3f}; mean gap "
                        f"{mean_gap_ms:.2f} ms per op (allowed {1e3 * r['gap_allowed_s']:.2f}) "
                        f"predicts {r['with_gaps']:.3f}"))
    return rows
