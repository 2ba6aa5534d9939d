"""Benchmark ``collectives``: the from-scratch all-reduces against gloo's, side by side."""
from labutils.bench.suite import Row
from labutils.core.timing import Stats, compare
from labutils.cost.costmodel import bus_bandwidth
from labutils.experiments.collective_runs import KiB, MiB, measure_all_reduce


def run(quick=False):
    """Ring, recursive doubling and halving-doubling (from scratch) vs gloo's all-reduce: bus
    bandwidth at 1 KiB, 1 MiB and 64 MiB on 2 ranks, and each from-scratch time over gloo's:
    the median per-round ratio and its 95% interval (one round times every size and variant)."""
    sizes = [KiB, MiB] if quick else [KiB, MiB, 64 * MiB]
    world_size = 2
    stats = measure_all_reduce(sizes, world_size, repeats=2 if quick else 7,
                               impls=("gloo", "ring", "recursive_doubling", "halving_doubling"))
    rows = []
    for k, nbytes in enumerate(sizes):
        label = f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"
        for impl, st in stats.items():
            s = st[k]
            bw = Stats.of([bus_bandwidth(nbytes, t, world_size) / 1e9 for t in s.values])
            rows.append(Row("collectives", f"{impl} all-reduce busbw, {label}", bw, "GB/s",
                            f"median time {s.median * 1e3:.3g} ms"))
        for impl in ("ring", "recursive_doubling", "halving_doubling"):
            c = compare(stats[impl][k], stats["gloo"][k])
            rows.append(Row("collectives", f"{impl} / gloo time, {label}", c.ratio, "ratio",
                            c.fmt()))
    return rows
