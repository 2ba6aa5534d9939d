"""Benchmark ``ddp``: all-reduce bus bandwidth (gloo and shared memory) and DDP step times."""
from labutils.bench.suite import Row
from labutils.core.launcher import launch
from labutils.core.timing import Stats, compare
from labutils.cost.costmodel import bus_bandwidth
from labutils.experiments.allreduce_fit import allreduce_fit
from labutils.experiments.ddp_performance import (
    allreduce_worker,
    ddp_step_worker,
    memcpy_bandwidth,
)


def run(quick=False):
    """Headline figures of 04c: bandwidths, 1 vs 2 rank throughput, cost-model error."""
    reps = 1 if quick else 7
    rows = []
    copy = memcpy_bandwidth(repeats=reps)
    rows.append(Row("ddp", "memory copy bandwidth, 64 MiB",
                    Stats(copy.median / 1e9, copy.min / 1e9, copy.max / 1e9), "GB/s"))
    sizes = (1 << 10, 1 << 20, 64 << 20)
    ar = launch(allreduce_worker, sizes=sizes, repeats=reps, world_size=2)[0]
    for n in sizes:
        label = {1 << 10: "1 KiB", 1 << 20: "1 MiB", 64 << 20: "64 MiB"}[n]
        for impl in ("gloo", "shm", "shm zero-copy"):
            t = ar[n][impl]
            bw = Stats(bus_bandwidth(n, t.median, 2) / 1e9, bus_bandwidth(n, t.max, 2) / 1e9,
                       bus_bandwidth(n, t.min, 2) / 1e9)
            limit = (f"limit: a memory copy, {copy.median / 1e9:.1f} GB/s"
                     if impl != "gloo" and n == 64 << 20 else "")
            rows.append(Row("ddp", f"{impl} all-reduce bus bandwidth, {label}, 2 ranks", bw,
                            "GB/s", limit))
        for impl in ("shm", "shm zero-copy"):
            rows.append(Row("ddp", f"{impl} / gloo speed, {label}",
                            compare(ar[n]["gloo"], ar[n][impl]), "ratio",
                            "target >= 4 at 64 MiB" if n == 64 << 20 else ""))
    # throughput: one process with both cores vs 2 ranks (gloo, shm), same global batch
    runs = {"1 process, 2 threads": lambda: launch(ddp_step_worker, batch_per_rank=256, width=2,
                                                   world_size=1, threads_per_rank=2)[0],
            "2 ranks, gloo": lambda: launch(ddp_step_worker, batch_per_rank=128, width=2,
                                            world_size=2)[0],
            "2 ranks, shm": lambda: launch(ddp_step_worker, batch_per_rank=128, width=2,
                                           hook="shm", world_size=2)[0],
            "2 ranks, no communication": lambda: launch(ddp_step_worker, batch_per_rank=128,
                                                        width=2, hook="none", world_size=2)[0]}
    med = {k: [] for k in runs}
    for _ in range(reps):
        for k, fn in runs.items():
            med[k].append(fn().median)
    step = {k: v for k, v in med.items()}   # per round: the launches ran interleaved, paired
    for k in ("2 ranks, gloo", "2 ranks, shm", "2 ranks, no communication"):
        rows.append(Row("ddp", f"speedup of {k} over 1 process using both cores",
                        compare(step["1 process, 2 threads"], step[k], paired=True), "ratio",
                        "the ceiling for any all-reduce" if "no comm" in k else
                        "efficiency = speedup / 2"))
    for k in ("2 ranks, gloo", "2 ranks, shm"):
        rows.append(Row("ddp", f"{k}: step time of the no-communication ceiling / this",
                        compare(step["2 ranks, no communication"], step[k], paired=True), "ratio",
                        "limit 1.0: communication costs nothing" + (
                            "; target >= 0.95" if k == "2 ranks, shm" else "")))
    # cost model: the held-out fit of `bench costmodel`, on 1-16 MiB
    sizes = [1 << 20, 2 << 20, 4 << 20, 16 << 20]
    _, _, alpha, beta, held_out = allreduce_fit(sizes, 2 if quick else 16)
    err = max(abs(held_out(n).median - 1) for n in sizes)
    rows.append(Row("ddp", "cost model error on gloo all-reduce, 1-16 MiB (max)", err,
                    "fraction", f"alpha {alpha * 1e6:.0f} us, beta^-1 {1e-9 / beta:.2f} GB/s; "
                    f"held-out repeats; target 0.15"))
    return rows
