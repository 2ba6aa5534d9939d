"""Where a DDP step's time goes: bandwidths, scaling runs, per-rank timelines (04c, bench ddp).

* ``memcpy_bandwidth``: one memory copy's bytes/s, to compare with the all-reduce's bus
  bandwidth (``lu.costmodel.bus_bandwidth``);
* ``allreduce_worker``: gloo vs the shared-memory all-reduce, interleaved, per message size;
* ``ddp_step_worker``: seconds per DDP training step of the digits CNN (strong or weak scaling,
  plain gloo or the shared-memory comm hook);
* ``time_versions``: one step of every DDP version of 04a, and the same buckets launched after
  backward, in paired rounds;
* ``accumulation_cost``: what ``no_sync`` saves in a gradient-accumulation step (04b): the
  all-reduce calls and bytes counted, the step timed in paired rounds.

Per-rank timelines and exposed communication are in ``experiments/comm_spans.py``.
"""
from __future__ import annotations

import contextlib
import time
import uuid

import torch
import torch.distributed as dist
from torch import nn

from labutils.core.commcount import count_collectives
from labutils.core.env import one_thread
from labutils.core.i18n import N_
from labutils.core.rank import progress
from labutils.core.timing import Stats, slowest_rank
from labutils.data import models, workloads
from labutils.experiments.comm_spans import AfterBackwardDDP, paired_rounds
from labutils.experiments.ddp_equivalence import MixedNet
from labutils.parallel.ddp import BucketedDDP, HookedDDP, naive_allreduce_grads
from labutils.parallel.shm_allreduce import make_all_reduce, shm_allreduce_hook


def memcpy_bandwidth(nbytes=64 << 20, repeats=11):
    """Stats of bytes/s for one ``copy_`` of ``nbytes`` (read + write counted once, like a bus),
    on one thread, as gloo's and the shared-memory all-reduce's copies run: with the kernel's
    intra-op threads, a copy on a 2-core machine waits for a thread another process holds, and
    measured 2 GB/s on one run and 28 GB/s on the next."""
    src, dst = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
    with one_thread():
        dst.copy_(src)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    return Stats.of([nbytes / t for t in times])


def allreduce_worker(rank, world_size, sizes=(1 << 10, 1 << 20, 64 << 20), repeats=7):
    """``{nbytes: {"gloo": Stats, "shm": Stats, "shm zero-copy": Stats, "equal to gloo": bool}}``,
    times in seconds of the slowest rank, interleaved per size (the Stats of one size are
    paired: ``lu.timing.compare`` takes per-round ratios); the last entry checks both
    shared-memory results. "shm" copies the tensor into the shared segment and back out;
    "shm zero-copy" reduces a tensor that already lives there (``ShmAllReduce.buffer``)."""
    out = {}
    with make_all_reduce(buffer_bytes=max(sizes)) as shm:
        for nbytes in sizes:
            x = torch.ones(nbytes // 4)
            in_shm = shm.buffer(nbytes // 4)
            in_shm.fill_(1.0)
            runs = {"gloo": lambda: dist.all_reduce(x), N_("shm"): lambda: shm.all_reduce_(x),
                    N_("shm zero-copy"): lambda: shm.all_reduce_(in_shm)}
            times = {k: [] for k in runs}
            names = list(runs)
            reps = repeats if nbytes >= 1 << 20 else repeats * 10
            for i in range(reps + 1):
                progress(i, reps, "repeats")  # rank 0 drives a panel's bar
                for k in range(len(names)):
                    name = names[(i + k) % len(names)]   # rotate: none always runs first
                    dist.barrier()
                    t0 = time.perf_counter()
                    runs[name]()
                    if i:  # the first round warms up (page faults, connections)
                        times[name].append(time.perf_counter() - t0)
            # a collective ends when its slowest rank ends: take the max over ranks
            t = slowest_rank([times[k] for k in runs])
            rounds = uuid.uuid4().hex   # paired: lu.timing.compare(a, b) takes per-round ratios
            out[nbytes] = {k: Stats.of(row, rounds) for k, row in zip(runs, t)}
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


# ---- every DDP version timed side by side (04a) ---------------------------------------------


VERSIONS = ("naive", "hooks", "bucketed", "after backward", "torch")


def _timed_version(version, model, bucket_cap_mb):
    """(module to call, what to run between backward and ``opt.step()``) for one version."""
    if version == "naive":
        return model, lambda: naive_allreduce_grads(model)
    if version == "hooks":
        wrapped = HookedDDP(model)
        return wrapped, wrapped.wait
    if version == "bucketed":
        return BucketedDDP(model, bucket_cap_mb=bucket_cap_mb), None
    if version == "after backward":   # the same buckets, sent once backward has finished
        return AfterBackwardDDP(model, bucket_cap_mb=bucket_cap_mb), None
    if version == "torch":
        return nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb), None
    raise ValueError(f"unknown version {version!r}; choose from {VERSIONS}")


def time_versions(rank, world_size, hidden=256, batch_size=256, repeats=25, bucket_cap_mb=0.5,
                  versions=VERSIONS):
    """Seconds of one training step (zero_grad, forward, backward, gradient averaging,
    ``opt.step()``) of every version on MixedNet of width ``hidden``, in ``repeats`` paired
    rounds: each round runs every version once, after a barrier, in an order rotated each round
    (A B C, B C A, ...), and a round's time of a version is its slowest rank's (a step ends
    when its last rank does). ``"after backward"`` launches bucketed's buckets only once
    backward has finished: against ``"bucketed"`` it isolates what overlap buys. Returns
    ``{version: (Stats, all-reduce calls per step)}``, the Stats of one call paired (the same
    ``rounds``: ``lu.timing.compare`` pairs them). The calls are counted (``core.commcount``)
    in one untimed step after a warm-up step (PyTorch's DDP rebuilds its buckets after its
    first step). Every parameter is used."""
    torch.manual_seed(0)
    X = torch.randn(batch_size // world_size, 16)
    y = torch.randn(batch_size // world_size, 4)
    steps = {}
    for v in versions:
        torch.manual_seed(0)
        model = MixedNet(hidden=hidden)
        wrapped, finish = _timed_version(v, model, bucket_cap_mb)
        steps[v] = (wrapped, finish, torch.optim.SGD(model.parameters(), lr=1e-3))

    def step(wrapped, finish, opt):
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(wrapped(X), y).backward()
        if finish is not None:
            finish()
        opt.step()

    calls, times = {}, {v: [] for v in versions}
    for v, parts in steps.items():
        step(*parts)                               # warm-up (DDP rebuilds its buckets)
        with count_collectives() as counted:
            step(*parts)
        calls[v] = counted.all_reduces
    for i in range(repeats):
        progress(i + 1, repeats, "repeats")  # rank 0 drives a panel's bar
        for k in range(len(versions)):
            v = versions[(i + k) % len(versions)]   # rotate: no version always runs first
            dist.barrier()
            t0 = time.perf_counter()
            step(*steps[v])
            times[v].append(time.perf_counter() - t0)
    slowest = slowest_rank([times[v] for v in versions])   # a step ends with its slowest rank
    rounds = uuid.uuid4().hex
    return {v: (Stats.of(t, rounds), calls[v]) for v, t in zip(versions, slowest)}


# ---- what no_sync saves (04b) ----------------------------------------------------------------


def accumulation_cost(rank, world_size, accumulate_fns, micro_batches=4, micro_batch=32,
                      hidden=256, rounds=15):
    """One gradient-accumulation step (zero_grad, then ``fn(ddp_model, micro_batches,
    loss_fn)``) of PyTorch's DDP on MixedNet of width ``hidden`` for each ``accumulate_fns[name]``.
    Returns ``{"calls": {name: all-reduce calls}, "bytes": {name: all-reduced bytes}}`` (counted
    at the dispatcher in one step after a warm-up step), ``"gradient bytes"`` (the model's), and
    ``"seconds"``: ``{name: [seconds of the slowest rank, ...]}`` in ``rounds`` paired rounds."""
    if not accumulate_fns:
        raise ValueError("accumulate_fns is empty: pass {name: fn(ddp_model, micro_batches, "
                         "loss_fn)} for each way to accumulate")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(MixedNet(hidden=hidden))
    g = torch.Generator().manual_seed(rank)   # each rank its own shard of data
    batches = [(torch.randn(micro_batch, 16, generator=g), torch.randn(micro_batch, 4, generator=g))
               for _ in range(micro_batches)]

    def step(fn):
        model.zero_grad(set_to_none=True)
        fn(model, batches, nn.functional.mse_loss)

    calls, nbytes = {}, {}
    for name, fn in accumulate_fns.items():
        step(fn)                                  # warm-up (DDP rebuilds its buckets)
        with count_collectives() as counted:
            step(fn)
        calls[name], nbytes[name] = counted.all_reduces, counted.bytes_by_op["allreduce_"]
    seconds = paired_rounds({name: (lambda fn=fn: step(fn)) for name, fn in accumulate_fns.items()},
                            rounds)
    return {"calls": calls, "bytes": nbytes, "seconds": seconds,
            "gradient bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
