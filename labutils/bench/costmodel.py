"""Benchmark ``costmodel``: the alpha-beta fit's error on held-out all-reduces."""
from labutils.bench.suite import Row
from labutils.core.timing import Stats
from labutils.cost import costmodel as cm
from labutils.experiments.allreduce_fit import allreduce_fit


def run(quick=False):
    """Fit alpha-beta on half of the repeats, predict the other half; emulated 1GbE vs model."""
    KiB, MiB = 1 << 10, 1 << 20
    sizes = [64 * KiB, MiB, 4 * MiB] if quick else [4 * KiB, 64 * KiB, 256 * KiB, MiB, 2 * MiB,
                                                    4 * MiB, 16 * MiB]
    plain, emulated, alpha, beta, held_out = allreduce_fit(sizes, 2 if quick else 16)
    rows = [Row("costmodel", "fitted alpha (2 ranks, gloo, loopback)", alpha * 1e6, "us",
                "fit on the sizes >= 1 MiB, even repeats"),
            Row("costmodel", "fitted bandwidth 1/beta", 1e-9 / beta if beta else float("inf"),
                "GB/s")]
    for n in sizes:
        label = f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"
        rows.append(Row("costmodel", f"all-reduce {label}: measured / predicted", held_out(n),
                        "ratio", "held-out repeats; target within 15%" if n >= MiB else
                        "below the fitted range (no target)"))
    link = cm.get_link("1GbE")
    for n in sizes:
        if n < MiB:
            continue
        model = cm.allreduce_time(n, 2, link.alpha, link.beta)
        rows.append(Row("costmodel", f"emulated 1GbE all-reduce {n // MiB} MiB: measured / model",
                        Stats.of([t / model for t in emulated[n]]), "ratio",
                        f"model {model * 1e3:.3g} ms; target within 10%"))
    return rows
