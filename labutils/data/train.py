"""The reference training loop every parallel version is compared with, and its DDP twin.

    res = lu.train.train("digits", steps=200, seed=0)           # one process, whole batches
    res = lu.launch(lu.train.train_worker, "digits", steps=200, world_size=2)[0]  # DDP

Both walk the same seeded sequence of *global* batches (``global_batches``). In the DDP
version each rank takes its contiguous shard of every global batch (``shard``) and scales its
mean loss by ``shard_weight`` so that DDP's gradient *average* over ranks equals the gradient of
the mean loss over the whole global batch, even when the batch does not divide evenly. Hence
N ranks reproduce one process on the concatenated batch (tests/test_train.py asserts it).

``time_ddp_step`` splits a DDP step into compute and communication (lab 03c_scenarios).
Used by 02_pytorch_essentials, 03c_scenarios and the DDP labs (04a-04c).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from labutils.core.env import cpu_count
from labutils.core.rank import progress
from labutils.core.timing import Stats
from labutils.data import workloads


@dataclass
class TrainResult:
    """What a training run returns (by value, so it travels back from ranks)."""
    losses: list                      # global-batch mean loss at every step, before its update
    metrics: list                     # (step, test metric) pairs, every eval_every steps
    metric_name: str                  # "accuracy" or "perplexity"
    state_dict: dict = field(repr=False, default_factory=dict)  # final weights (CPU tensors)
    seconds: float = 0.0              # wall time of the loop (no evaluation)


def global_batches(n, batch_size, steps, seed=0):
    """``steps`` index tensors of ``batch_size`` samples out of ``n``: epochs of a seeded
    permutation, the last incomplete batch of each epoch dropped. Same on every rank."""
    if not 1 <= batch_size <= n:
        raise ValueError(f"batch_size must be in 1..{n} (the training set size); got {batch_size}")
    g = torch.Generator().manual_seed(seed)
    batches = []
    while len(batches) < steps:
        perm = torch.randperm(n, generator=g)
        for i in range(0, n - batch_size + 1, batch_size):
            if len(batches) == steps:
                break
            batches.append(perm[i:i + batch_size])
    return batches


def shard(batch, rank, world_size):
    """Rank ``rank``'s contiguous slice of ``batch`` along dim 0 (sizes differ by at most 1)."""
    return torch.tensor_split(batch, world_size)[rank]


def shard_weight(global_size, rank, world_size):
    """Factor for rank ``rank``'s mean loss so the ranks' *average* gradient is the gradient of
    the mean loss over all ``global_size`` samples: world_size * local_size / global_size."""
    local = global_size // world_size + (rank < global_size % world_size)  # as tensor_split
    return world_size * local / global_size


def shard_batch(batch, rank, world_size):
    """Exercise reference: ``(local_batch, loss_weight)`` for rank ``rank``."""
    return shard(batch, rank, world_size), shard_weight(len(batch), rank, world_size)


def _check_args(workload, steps, batch_size, world_size):
    wl = workloads.get(workload) if isinstance(workload, str) else workload
    batch_size = batch_size or wl.batch_size
    if batch_size < world_size:
        raise ValueError(f"batch_size {batch_size} < world_size {world_size}: every rank "
                         f"needs at least one sample; use batch_size >= {world_size}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1; got {steps}")
    global_batches(len(wl.train_set[1]), batch_size, 0)  # validates batch_size
    return wl, batch_size


def _fit(wl, model, steps, batch_size, seed, lr, eval_every, rank, world_size):
    """The loop itself; ``model`` may be DDP-wrapped (then gradients are averaged in backward)."""
    opt = wl.make_optimizer(model.parameters(), lr)
    X, y = wl.train_set
    module = getattr(model, "module", model)
    losses, metrics, seconds = [], [], 0.0
    for step, idx in enumerate(global_batches(len(y), batch_size, steps, seed), start=1):
        progress(step, steps, "steps")  # rank 0 drives a panel's bar
        t0 = time.perf_counter()
        xb, yb = shard(X[idx], rank, world_size), shard(y[idx], rank, world_size)
        loss = wl.loss_fn(model(xb), yb) * shard_weight(batch_size, rank, world_size)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        report = loss.detach().clone()
        if world_size > 1:  # the global-batch mean loss, the number one process would print
            dist.all_reduce(report)
            report /= world_size
        seconds += time.perf_counter() - t0
        losses.append(float(report))
        if eval_every and (step % eval_every == 0 or step == steps):
            metrics.append((step, wl.metric(module)))
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    return TrainResult(losses, metrics, wl.metric_name, state, seconds)


def train(workload, steps=100, batch_size=None, seed=0, lr=None, eval_every=0):
    """Single-process reference: train ``workload`` (a name or a Workload) for ``steps`` steps.

    The model starts from ``make_model(seed)`` and sees ``global_batches(..., seed)``; the same
    arguments give the same losses and weights. ``eval_every=k`` records the test metric every
    k steps and at the end. Returns a ``TrainResult``.
    """
    wl, batch_size = _check_args(workload, steps, batch_size, 1)
    return _fit(wl, wl.make_model(seed), steps, batch_size, seed, lr, eval_every, 0, 1)


def train_worker(rank, world_size, workload="digits", steps=100, batch_size=None, seed=0,
                 lr=None, eval_every=0):
    """The same loop on ``world_size`` ranks with ``DistributedDataParallel``: each rank trains
    on its shard of every global batch. Run with ``lu.launch`` or ``python -m labutils.core.run``;
    validate first with ``validate_train_args`` (ranks cannot ask the caller to fix input)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    wl, batch_size = _check_args(workload, steps, batch_size, world_size)
    model = DDP(wl.make_model(seed)) if world_size > 1 else wl.make_model(seed)
    return _fit(wl, model, steps, batch_size, seed, lr, eval_every, rank, world_size)


def train_to_file(rank, world_size, out, workload="digits", steps=20, seed=0):
    """``train_worker`` for launchers that return nothing (torchrun, ``mp.spawn``): rank 0 saves
    the losses to ``out`` with ``torch.save``. Returns the last loss, rounded (02's launcher map)."""
    result = train_worker(rank, world_size, workload, steps, seed=seed)
    if rank == 0:
        torch.save(result.losses, out)
    return round(result.losses[-1], 3)


def spawn_entry(index, world_size, init_file, out, workload="digits", steps=20):
    """Entry point for ``torch.multiprocessing.spawn(spawn_entry, args=(world_size, ...))``.

    spawn starts fresh interpreters that find ``fn`` by importing its module, so it must be a
    module-level function like this one (a notebook cell's function lives in ``__main__``, which
    the children cannot import). spawn also leaves the process group to us: rendezvous here
    goes through a shared file.
    """
    cores = cpu_count()
    torch.set_num_threads(max(1, (cores or 1) // world_size))  # as lu.launch: no oversubscription
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=index,
                            world_size=world_size)
    try:
        train_to_file(index, world_size, out, workload, steps)
        # wait for every rank before tearing gloo down: a rank that leaves while a peer still
        # writes its file closes connections under it, and gloo's threads then abort the process
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Leave without running C++ static destructors, as `python -m labutils.core.run` does: a gloo
    # thread still winding down there can abort a finished rank (SIGABRT, seen once in CI), and
    # spawn would report the run as failed. The losses are saved by now; exit code 0 is success.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def validate_train_args(workload, steps=100, batch_size=None, world_size=1):
    """Raise a clear ValueError in the caller, before ranks start, for arguments that cannot work."""
    if isinstance(workload, str) and workload not in workloads.NAMES:
        raise ValueError(f"unknown workload {workload!r}; choose one of "
                         f"{', '.join(workloads.NAMES)}")
    _check_args(workload, steps, batch_size, world_size)


# ---- compute vs communication (03c_scenarios) ------------------------------------------------

def time_ddp_step(rank, world_size, cases="digits", repeats=20, seed=0, calls=10):
    """Per round, on this rank, each case's DDP step split into its compute and its communication.

    ``cases``: a workload name, or a dict label -> (workload name, global batch size or None
    for the workload's). Every round times, for each case in turn, the ranks started together:

    * ``compute``: forward, backward and update of this rank's shard under ``no_sync()``, so
      no communication at all;
    * ``allreduce``: an all-reduce of a buffer of the gradient's size, what DDP sends per step
      (gradients under 1 MiB fill DDP's first bucket, sent after backward: nothing overlaps);
      each sample is the mean of ``calls`` back-to-back calls, enough work to time.

    Returns {label: {"compute": Stats, "allreduce": Stats, "grad_bytes": int}}. Sample i of
    every Stats is round i, on every rank and for every case, so they pair round by round.
    """
    if isinstance(cases, str):
        cases = {cases: (cases, None)}
    pieces = {label: _ddp_case(rank, world_size, name, batch_size, seed, calls)
              for label, (name, batch_size) in cases.items()}
    times = {label: {"compute": [], "allreduce": []} for label in pieces}
    for i in range(repeats + 1):  # round 0 is warm-up
        progress(i, repeats, "repeats")  # rank 0 drives a panel's bar
        for label, (timed, _) in pieces.items():
            for kind, (fn, count) in timed.items():
                dist.barrier()  # start together: no rank's time includes waiting for another
                t0 = time.perf_counter()
                fn()
                if i:
                    times[label][kind].append((time.perf_counter() - t0) / count)
    return {label: {"compute": Stats.of(t["compute"]), "allreduce": Stats.of(t["allreduce"]),
                    "grad_bytes": pieces[label][1]} for label, t in times.items()}


def _ddp_case(rank, world_size, workload, batch_size, seed, calls):
    """One case on this rank, warmed up: {kind: (fn, calls per sample)} and the gradient's bytes."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    wl, batch_size = _check_args(workload, 1, batch_size, world_size)
    model = DDP(wl.make_model(seed))
    opt = wl.make_optimizer(model.parameters())
    X, y = wl.train_set
    idx = global_batches(len(y), batch_size, 1, seed)[0]
    xb, yb = shard(X[idx], rank, world_size), shard(y[idx], rank, world_size)
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))

    def step():
        opt.zero_grad(set_to_none=True)
        wl.loss_fn(model(xb), yb).backward()
        opt.step()

    def compute():
        with model.no_sync():
            step()

    def allreduce():
        for _ in range(calls):
            # looked up at each call, so lu.emulation.emulate(link) around the caller puts it
            # on an emulated link (03c does)
            dist.all_reduce(flat)

    # Two synchronised steps first: the first records the order gradients arrive in, and the
    # second's forward rebuilds DDP's buckets in that order, a broadcast that would otherwise
    # fall into the first no_sync forward (it runs there too) and into a timed compute sample.
    step()
    step()
    grad_bytes = flat.numel() * flat.element_size()
    return {"compute": (compute, 1), "allreduce": (allreduce, calls)}, grad_bytes
