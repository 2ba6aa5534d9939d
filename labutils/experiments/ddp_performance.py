"""Where a DDP step's time goes: bandwidths, scaling runs, per-rank timelines (04c, bench ddp).

* ``memcpy_bandwidth``: one memory copy's bytes/s, to compare with the all-reduce's bus
  bandwidth (``lu.costmodel.bus_bandwidth``);
* ``allreduce_worker``: gloo vs the shared-memory all-reduce, interleaved, per message size;
* ``ddp_step_worker``: seconds per DDP training step of the digits CNN (strong or weak scaling,
  plain gloo or the shared-memory comm hook);
* ``timeline_worker``: forward, backward and each bucket's all-reduce as spans, drawn by
  ``lu.timeline_plot.plot_overlap`` on two lanes per rank (compute above, communication below)
  so overlap is visible;
  ``lu.timeline.to_chrome_trace`` writes the same spans for Perfetto.
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn

from labutils.core.commcount import count_collectives
from labutils.core.launcher import launch
from labutils.core.rank import progress
from labutils.core.timeline import Timeline
from labutils.core.timing import Stats, slowest_rank
from labutils.data import models, workloads
from labutils.experiments.ddp_equivalence import MixedNet
from labutils.parallel.ddp import BucketedDDP, HookedDDP, naive_allreduce_grads
from labutils.parallel.shm_allreduce import make_all_reduce, shm_allreduce_hook


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
    """``{nbytes: {"gloo": Stats, "shm": Stats, "shm zero-copy": Stats, "equal to gloo": bool}}``,
    times in seconds, interleaved per size; the last entry checks both shared-memory results. "shm" copies the tensor into the shared segment and back out;
    "shm zero-copy" reduces a tensor that already lives there (``ShmAllReduce.buffer``)."""
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
            t = slowest_rank([times[k] for k in runs])
            out[nbytes] = {k: Stats.of(row) for k, row in zip(runs, t)}
            out[nbytes]["equal to gloo"] = _same_sums(shm, nbytes // 4, rank)
    return out


def _same_sums(shm, n, rank):
    """Do both shared-memory all-reduces give gloo's sums? Integers below 2**24 in float32 sum
    exactly in any order, so the comparison can be exact on any number of ranks."""
    mine = (torch.arange(n) % 1024 * (rank + 1)).float()
    expected = mine.clone()
    dist.all_reduce(expected)
    copied = mine.clone()
    shm.all_reduce_(copied)
    in_shm = shm.buffer(n)
    in_shm.copy_(mine)
    shm.all_reduce_(in_shm)
    return bool(torch.equal(copied, expected) and torch.equal(in_shm, expected))


def ddp_step_worker(rank, world_size, batch_per_rank=64, steps=6, hook=None, width=1):
    """Stats of seconds per DDP step of the digits CNN (``width`` x its channels), the first
    step excluded. ``hook="shm"`` averages gradients through shared memory; ``hook="none"``
    runs the same step under ``no_sync()``: no communication, the ceiling DDP can reach."""
    from torch.nn.parallel import DistributedDataParallel as DDP

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
    """Spans of ``steps`` training steps with ``lu.ddp.BucketedDDP``: ``forward``; ``backward``,
    autograd's computation only; ``wait``, from there until every bucket is reduced and copied;
    and one ``allreduce`` span per bucket (launch to completion, recorded on gloo's thread).
    Every span of step k has ``meta["step"] == k``."""
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
        first = len(tl.spans)
        with tl.span("forward", label=f"{step}"):
            loss = wl.loss_fn(model(xb), yb)
        start = time.perf_counter()
        loss.backward()   # returns after BucketedDDP.wait, which autograd runs at its end
        wait = next(s for s in reversed(tl.spans) if s.name == "wait")
        tl.add("backward", start, wait.start, label=f"{step}")
        for s in tl.spans[first:]:
            s.meta["step"] = step     # every span of this step, the all-reduces included
    return list(tl.spans)


def overlap_by_step(spans):
    """Per (rank, step): the share of all-reduce time that ran during backward's computation,
    and the exposed communication (the ``wait`` after it), in seconds."""
    out = {}
    keys = {(s.rank, s.meta["step"]) for s in spans if s.name == "backward"}
    for rank, step in sorted(keys):
        mine = [s for s in spans if s.rank == rank and s.meta.get("step") == step]
        back = next(s for s in mine if s.name == "backward")
        comm = [s for s in mine if s.name == "allreduce"]
        total = sum(s.duration for s in comm)
        hidden = sum(max(0.0, min(s.end, back.end) - max(s.start, back.start)) for s in comm)
        exposed = sum(s.duration for s in mine if s.name == "wait")
        out[(rank, step)] = (hidden / total if total else 0.0, exposed)
    return out


def overlap_sweep(bucket_caps, steps=5, world_size=2, width=4, batch_per_rank=64):
    """For each bucket cap (MiB): (Stats of the hidden share, Stats of the exposed seconds, the
    number of buckets), over every rank and step."""
    out = {}
    for cap in bucket_caps:
        spans = [s for r in launch(timeline_worker, steps=steps, bucket_cap_mb=cap, width=width,
                                   batch_per_rank=batch_per_rank, world_size=world_size)
                 for s in r]
        per = overlap_by_step(spans)
        n = sum(1 for s in spans if s.name == "allreduce") // (steps * world_size)
        out[cap] = (Stats.of([h for h, _ in per.values()]), Stats.of([e for _, e in per.values()]),
                    n)
    return out


# ---- every DDP version timed side by side (04a) ---------------------------------------------


def time_versions(rank, world_size, hidden=256, batch_size=128, repeats=5, bucket_cap_mb=0.5,
                  versions=("naive", "hooks", "bucketed", "torch")):
    """Time one training step of every version, interleaved (A B C D A B C D ...), on MixedNet
    of width ``hidden``. Returns ``{version: (Stats of seconds per step, all-reduces per step)}``;
    the all-reduces are counted (``core.commcount``) in one untimed step after the warm-up one
    (PyTorch's DDP rebuilds its buckets after its first step)."""
    torch.manual_seed(0)
    X = torch.randn(batch_size // world_size, 16)
    y = torch.randn(batch_size // world_size, 4)
    steps = {}
    for v in versions:
        model = MixedNet(hidden=hidden)
        if v == "naive":
            steps[v] = (model, lambda m=model: naive_allreduce_grads(m))
        elif v == "hooks":
            wrapped = HookedDDP(model)
            steps[v] = (wrapped, wrapped.wait)
        elif v == "bucketed":
            steps[v] = (BucketedDDP(model, bucket_cap_mb=bucket_cap_mb), None)
        else:
            steps[v] = (nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb),
                        None)

    def step(wrapped, finish):
        wrapped.zero_grad(set_to_none=True)
        nn.functional.mse_loss(wrapped(X), y).backward()
        if finish is not None:
            finish()

    calls, times = {}, {v: [] for v in versions}
    for v, (wrapped, finish) in steps.items():
        step(wrapped, finish)                       # warm-up (DDP rebuilds its buckets)
        with count_collectives() as counted:
            step(wrapped, finish)
        calls[v] = counted.all_reduces
    for i in range(repeats):
        progress(i + 1, repeats, "repeats")  # rank 0 drives a panel's bar
        for v, (wrapped, finish) in steps.items():
            dist.barrier()
            t0 = time.perf_counter()
            step(wrapped, finish)
            times[v].append(time.perf_counter() - t0)
    return {v: (Stats.of(times[v]), calls[v]) for v in versions}
