"""Where a DDP step's time goes: bandwidths, scaling runs, per-rank timelines (04c, bench ddp).

* ``bus_bandwidth``: the all-reduce figure nccl-tests reports, size / time * 2(p-1)/p, comparable
  across world sizes and with the memory-copy bandwidth (``memcpy_bandwidth``);
* ``allreduce_worker``: gloo vs the shared-memory all-reduce, interleaved, per message size;
* ``ddp_step_worker``: seconds per DDP training step of the digits CNN (strong or weak scaling,
  plain gloo or the shared-memory comm hook);
* ``timeline_worker`` + ``plot_overlap``: forward, backward and each bucket's all-reduce as spans,
  drawn on two lanes per rank (compute above, communication below) so overlap is visible;
  ``lu.timeline.to_chrome_trace`` writes the same spans for Perfetto.
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

from .launcher import progress
from .timing import Stats


def bus_bandwidth(nbytes, seconds, world_size):
    """All-reduce bus bandwidth in bytes/s: what each link carries, 2(p-1)/p of the data."""
    if world_size < 2:
        raise ValueError("bus bandwidth needs world_size >= 2")
    return nbytes / seconds * 2 * (world_size - 1) / world_size


def memcpy_bandwidth(nbytes=64 << 20, repeats=5):
    """Stats of bytes/s for one ``copy_`` of ``nbytes`` (read + write counted once, like a bus)."""
    src, dst = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return Stats.of([nbytes / t for t in times])


def allreduce_worker(rank, world_size, sizes=(1 << 10, 1 << 20, 64 << 20), repeats=5):
    """``{nbytes: {"gloo": Stats, "shm": Stats, "shm zero-copy": Stats}}`` in seconds, timed
    interleaved per size. "shm" copies the tensor into the shared segment and back out;
    "shm zero-copy" reduces a tensor that already lives there (``ShmAllReduce.buffer``)."""
    from .shm_allreduce import make_all_reduce
    out = {}
    with make_all_reduce(buffer_bytes=max(sizes)) as shm:
        for nbytes in sizes:
            x = torch.ones(nbytes // 4)
            in_shm = shm.buffer(nbytes // 4)
            in_shm.fill_(1.0)
            runs = {"gloo": lambda: dist.all_reduce(x), "shm": lambda: shm.all_reduce_(x),
                    "shm zero-copy": lambda: shm.all_reduce_(in_shm)}
            times = {k: [] for k in runs}
            reps = repeats if nbytes >= 1 << 20 else repeats * 10
            for i in range(reps + 1):
                progress(i, reps, "repeats")  # rank 0 drives a panel's bar
                for name, fn in runs.items():
                    dist.barrier()
                    t0 = time.perf_counter()
                    fn()
                    if i:  # the first round warms up (page faults, connections)
                        times[name].append(time.perf_counter() - t0)
            # a collective ends when its slowest rank ends: take the max over ranks
            t = torch.tensor([times[k] for k in runs], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            out[nbytes] = {k: Stats.of(row.tolist()) for k, row in zip(runs, t)}
    return out


def ddp_step_worker(rank, world_size, batch_per_rank=64, steps=6, hook=None, width=1):
    """Stats of seconds per DDP step of the digits CNN (``width`` x its channels), the first
    step excluded. ``hook="shm"`` averages gradients through shared memory; ``hook="none"``
    runs the same step under ``no_sync()``: no communication, the ceiling DDP can reach."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from . import models, workloads
    from .shm_allreduce import make_all_reduce, shm_allreduce_hook
    wl = workloads.get("digits")
    torch.manual_seed(0)
    model = models.DigitsCNN(channels=16 * width, hidden=64 * width)
    if world_size > 1:
        model = DDP(model)
    shm = None
    if hook == "shm" and world_size > 1:
        shm = make_all_reduce()
        model.register_comm_hook(shm, shm_allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    X, y = wl.train_set
    xb, yb = X[:batch_per_rank], y[:batch_per_rank]
    if hook not in (None, "shm", "none"):
        raise ValueError(f"hook must be None, 'shm' or 'none'; got {hook!r}")
    local = model.no_sync if hook == "none" and world_size > 1 else contextlib.nullcontext
    times = []
    for i in range(steps + 1):
        progress(i, steps, "steps")  # rank 0 drives a panel's bar
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with local():
            wl.loss_fn(model(xb), yb).backward()
        opt.step()
        if i:
            times.append(time.perf_counter() - t0)
    if shm is not None:
        shm.close()
    return Stats.of(times)


def timeline_worker(rank, world_size, steps=3, bucket_cap_mb=0.1, width=4, batch_per_rank=64):
    """Spans of ``steps`` training steps with ``lu.ddp.BucketedDDP``: forward, backward and one
    ``allreduce`` span per bucket (launch to completion, recorded on gloo's thread)."""
    from . import models, workloads
    from .ddp import BucketedDDP
    from .timeline import Timeline
    tl = Timeline(rank)
    wl = workloads.get("digits")
    torch.manual_seed(0)
    model = BucketedDDP(models.DigitsCNN(channels=16 * width, hidden=64 * width),
                        bucket_cap_mb=bucket_cap_mb, timeline=tl)
    X, y = wl.train_set
    xb, yb = X[:batch_per_rank], y[:batch_per_rank]
    for step in range(steps + 1):
        progress(step, steps, "steps")  # rank 0 drives a panel's bar
        if step == 1:
            tl.spans.clear()  # the first step warms up
        dist.barrier()
        with tl.span("forward", label=f"{step}"):
            loss = wl.loss_fn(model(xb), yb)
        with tl.span("backward", label=f"{step}"):
            loss.backward()   # ends after the queued wait: every bucket reduced
    return list(tl.spans)


def plot_overlap(spans, ax=None, title=""):
    """Gantt chart with two lanes per rank: compute (forward, backward) and communication.
    Bucket labels show only where they fit in their bar and clear each other (buckets' spans
    can overlap in time); the legend sits right of the axes."""
    import matplotlib.pyplot as plt

    from .timeline import DEFAULT_COLORS, _label_bars, _lane_axis, _legend_outside, normalise
    spans = normalise(spans)
    ranks = sorted({s.rank for s in spans})
    if ax is None:   # constrained layout keeps the outside legend inside the figure
        _, ax = plt.subplots(figsize=(10, 1.1 * len(ranks) + 1), layout="constrained")
    labelled = []
    for s in spans:
        lane = s.rank * 2 + (1 if s.name == "allreduce" else 0)
        bar = ax.barh(lane, s.duration * 1e3, left=s.start * 1e3, height=0.8,
                      color=DEFAULT_COLORS.get(s.name, "grey"), edgecolor="black",
                      linewidth=0.3).patches[0]
        if s.label and s.name == "allreduce":
            labelled.append((bar, s.label))
    _label_bars(ax, labelled, fontsize=7)
    _lane_axis(ax, [2 * r + k for r in ranks for k in (0, 1)],
               [f"rank {r} {what}" for r in ranks for what in ("compute", "comm")])
    names = [n for n in ("forward", "backward", "allreduce") if any(s.name == n for s in spans)]
    _legend_outside(ax, {n: DEFAULT_COLORS[n] for n in names})
    ax.set_xlabel("time (ms)")
    if title:
        ax.set_title(title)
    return ax


def overlap_fraction(spans):
    """Share of all-reduce time that ran while the same rank was in backward."""
    total = hidden = 0.0
    for s in spans:
        if s.name != "allreduce":
            continue
        total += s.duration
        for b in spans:
            if b.rank == s.rank and b.name == "backward":
                hidden += max(0.0, min(s.end, b.end) - max(s.start, b.start))
    return hidden / total if total else 0.0


# ---- python -m labutils.bench ddp ------------------------------------------------------------

def bench_ddp(quick=False):
    """Headline figures of 04c: bandwidths, 1 vs 2 rank throughput, cost-model error."""
    from . import costmodel
    from .bench import Row
    from .launcher import launch
    reps = 1 if quick else 5
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
            rows.append(Row("ddp", f"{impl} all-reduce bus bandwidth, {label}, 2 ranks", bw,
                            "GB/s"))
        for impl in ("shm", "shm zero-copy"):
            rows.append(Row("ddp", f"{impl} / gloo speed, {label}", ar[n]["gloo"] / ar[n][impl],
                            "ratio", "target >= 4 at 64 MiB" if n == 64 << 20 else ""))
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
    step = {k: Stats.of(v) for k, v in med.items()}
    for k in ("2 ranks, gloo", "2 ranks, shm", "2 ranks, no communication"):
        rows.append(Row("ddp", f"speedup of {k} over 1 process using both cores",
                        step["1 process, 2 threads"] / step[k], "ratio",
                        "the ceiling for any all-reduce" if "no comm" in k else
                        "efficiency = speedup / 2"))
    for k in ("2 ranks, gloo", "2 ranks, shm"):
        rows.append(Row("ddp", f"{k}: step time of the no-communication ceiling / this",
                        step["2 ranks, no communication"] / step[k], "ratio",
                        "1.0 = communication costs nothing"))
    # cost model: the held-out fit of `bench costmodel`, on 1-16 MiB
    from .bench import allreduce_fit
    sizes = [1 << 20, 2 << 20, 4 << 20, 16 << 20]
    _, _, alpha, beta, held_out = allreduce_fit(sizes, 2 if quick else 16)
    err = max(abs(held_out(n).median - 1) for n in sizes)
    rows.append(Row("ddp", "cost model error on gloo all-reduce, 1-16 MiB (max)", err,
                    "fraction", f"alpha {alpha * 1e6:.0f} us, beta^-1 {1e-9 / beta:.2f} GB/s; "
                    f"held-out repeats; target 0.15"))
    return rows
