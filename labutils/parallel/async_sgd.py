"""Synchronous vs asynchronous SGD on real ranks: all-reduce SGD, a parameter server, Hogwild.

Used by ``03b_sync_async_sgd`` (sync vs async, stragglers, staleness) and
``03d_communication_challenges`` (gradients all-reduced in fp16/bf16) and
``03e1_data_inconsistency`` (sync runs bitwise reproducible).

The model is a small MLP on the digits whose parameters live in ONE flat fp32 vector
(``labutils.parallel.flat_mlp``, re-exported here). Every run returns a history
of the full training-set loss against examples processed (counted by the ranks as they go, not
computed from the settings) and against wall time (time spent evaluating the loss is left out
of the clock and returned as ``eval_s``); the last point is taken when every rank has finished,
whether or not ``steps`` is a multiple of ``eval_every``.

* ``sync_sgd_worker``: every step, each rank computes a gradient on its own mini-batch,
  all-reduces it and applies the mean: equal, step for step, to single-process SGD on the union
  of the batches (``reference_sgd``). A straggler holds every rank back.
* ``parameter_server_worker``: rank 0 keeps the weights; ranks 1.. pull weights, compute a
  gradient and push it without waiting for each other (Dean et al., "Large Scale Distributed
  Deep Networks", NeurIPS 2012). The server applies gradients in arrival order, so a gradient
  may have been computed on weights several updates old: its *staleness*, recorded per update.
* ``hogwild_worker``: no server and no lock; every rank reads and writes one weight vector in
  shared memory (Recht et al., "Hogwild!", NeurIPS 2011, whose guarantee assumes sparse updates
  that rarely touch the same weights; this dense MLP's updates all touch every weight).
The single-process simulation with a fixed staleness, for the intuition behind the measured
parameter-server points, is ``labutils.experiments.staleness.delayed_sgd``; that module also
replays a run's trace and runs the straggler experiment with its serial controls. The runs
(validate, launch) are in ``labutils.experiments.sgd_runs``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from labutils.core.env import one_thread
from labutils.parallel.flat_mlp import (  # noqa: F401 (re-exported: async_sgd.init_params, ...)
    accuracy,
    batch_indices,
    full_loss,
    init_params,
    loss_and_grad,
)


@dataclass(frozen=True)
class SGDConfig:
    """One run's settings, the same on every rank."""
    steps: int = 150          # updates each worker contributes
    batch_size: int = 16      # examples per worker per step
    lr: float = 0.1
    hidden: int = 32
    seed: int = 0
    eval_every: int = 10      # worker steps between two evaluations of the full loss
    delay: float = 0.0        # seconds the straggler (the last rank) sleeps every step
    compress: str = "float32"  # dtype gradients travel in (sync SGD): float16, bfloat16

    def validate(self):
        for name in ("steps", "batch_size", "hidden", "eval_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an int >= 1; got {getattr(self, name)!r}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0; got {self.lr}")
        if self.delay < 0:
            raise ValueError(f"delay must be >= 0 seconds; got {self.delay}")
        if self.compress not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"compress must be 'float32', 'float16' or 'bfloat16'; "
                             f"got {self.compress!r}")
        return self


class _History:
    """Full-loss points against examples processed and wall time, evaluation time excluded.

    Rank 0 makes it before the ranks' first barrier, so its clock starts before any rank's
    first step: every sleep of a straggler falls inside it (so does the barrier's wait)."""

    def __init__(self, params, X, y, cfg):
        self.X, self.y, self.cfg = X, y, cfg
        self.points = []
        self.t0 = time.perf_counter()
        self.eval_s = 0.0
        self.add(0, params)

    def add(self, examples, params):
        t = time.perf_counter()
        self.points.append((examples, t - self.t0 - self.eval_s,
                            full_loss(params, self.X, self.y, self.cfg.hidden)))
        self.eval_s += time.perf_counter() - t

    def result(self, name, params, **extra):
        ex, ts, ls = zip(*self.points)
        return dict(name=name, examples=list(ex), time=list(ts), loss=list(ls),
                    params=params.clone(), eval_s=self.eval_s, **extra)


def _straggle(cfg, rank, world_size):
    if cfg.delay and rank == world_size - 1:
        time.sleep(cfg.delay)


# ---- synchronous all-reduce SGD -------------------------------------------------------------

def sync_sgd_worker(rank, world_size, X, y, cfg):
    """Every rank: gradient on its own batch, all-reduce, mean, the same update everywhere."""
    params, examples = init_params(X.shape[1], 10, cfg), 0
    hist = _History(params, X, y, cfg) if rank == 0 else None  # before the barrier: see _History
    dist.barrier()
    for step in range(cfg.steps):
        idx = batch_indices(cfg, rank, step, len(X))
        _, grad = loss_and_grad(params, X[idx], y[idx], cfg.hidden)
        _straggle(cfg, rank, world_size)
        wire = grad.to(getattr(torch, cfg.compress))  # compression: fewer bytes on the wire
        dist.all_reduce(wire)            # everyone waits here for the slowest rank
        params -= cfg.lr * wire.float() / world_size
        examples += len(idx)             # this rank's own count
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:  # the last point: the end
            counted = torch.tensor([examples])
            dist.all_reduce(counted)     # every rank's count, summed (exact: int64)
            if rank == 0:
                hist.add(int(counted), params)
    return hist.result("sync all-reduce", params) if rank == 0 else None


def reference_sgd(X, y, cfg, world_size, first_rank=0):
    """Single-process SGD on the union of the batches of ranks ``first_rank ..
    first_rank + world_size - 1``: what sync SGD must equal."""
    with one_thread():
        return _reference_sgd(X, y, cfg, range(first_rank, first_rank + world_size))


def _reference_sgd(X, y, cfg, ranks):
    params = init_params(X.shape[1], 10, cfg)
    for step in range(cfg.steps):
        idx = torch.cat([batch_indices(cfg, r, step, len(X)) for r in ranks])
        _, grad = loss_and_grad(params, X[idx], y[idx], cfg.hidden)
        params -= cfg.lr * grad
    return params


# ---- asynchronous: a parameter server -------------------------------------------------------

def parameter_server_worker(rank, world_size, X, y, cfg):
    """Rank 0 serves the weights; ranks 1.. push gradients and pull weights, never waiting for
    one another. A pull is the flat vector plus one slot: the weights' version number (or -1,
    "stop"); a push is the gradient plus three: that version, the batch's examples and the
    worker's step. The server applies ``steps * workers`` gradients from whoever sends them, so
    a straggler simply contributes fewer; its ``trace`` (worker, worker step, version) per
    update lets one process replay the run exactly (``staleness.replay_parameter_server``)."""
    n = init_params(X.shape[1], 10, cfg).numel()
    workers = world_size - 1
    if rank == 0:
        params, version = init_params(X.shape[1], 10, cfg), 0
        hist = _History(params, X, y, cfg)                   # before the barrier: see _History
        dist.barrier()
        for w in range(1, world_size):                      # everyone's first pull
            dist.send(torch.cat([params, torch.tensor([0.0])]), w)
        msg, staleness, pushes, trace = torch.empty(n + 3), [], [0] * world_size, []
        active, examples = workers, 0
        while active:
            src = dist.recv(msg)                             # whoever pushes first is served
            if version == cfg.steps * workers:               # done: tell this worker to stop
                dist.send(torch.cat([params, torch.tensor([-1.0])]), src)
                active -= 1
                continue
            staleness.append(version - int(msg[n]))          # updates since its weights
            trace.append((src, int(msg[n + 2]), int(msg[n])))
            params -= cfg.lr * msg[:n]
            version += 1
            pushes[src] += 1
            examples += int(msg[n + 1])
            dist.send(torch.cat([params, torch.tensor([float(version)])]), src)
            if version % (cfg.eval_every * workers) == 0 or version == cfg.steps * workers:
                hist.add(examples, params)
        return hist.result("parameter server", params, staleness=staleness,
                           pushes=pushes[1:], trace=trace)
    msg = torch.empty(n + 1)
    dist.barrier()
    step = 0
    while True:
        dist.recv(msg, 0)                                    # pull the newest weights
        if msg[n] < 0:
            return None
        idx = batch_indices(cfg, rank, step, len(X))
        _, grad = loss_and_grad(msg[:n], X[idx], y[idx], cfg.hidden)
        _straggle(cfg, rank, world_size)
        tags = torch.tensor([msg[n].item(), float(len(idx)), float(step)])
        dist.send(torch.cat([grad, tags]), 0)                # push, tagged with its version
        step += 1


# ---- asynchronous: Hogwild on shared memory --------------------------------------------------

def hogwild_worker(rank, world_size, X, y, cfg, path):
    """Every rank updates the weights in the shared file ``path`` in place, with no lock.

    The file also holds one counter per rank, the examples it has applied, so rank 0's points
    count every rank's work (a sleeping straggler does not keep pace with rank 0). The last
    point is taken after the final barrier: when every rank is done."""
    n = init_params(X.shape[1], 10, cfg).numel()
    # Mapped from a file by name: lu.launch pickles its arguments, so a tensor passed as one
    # would arrive as a copy (torch.multiprocessing with share_memory() shares it instead).
    # fp32 counts are exact up to 2**24 examples
    shared = torch.from_file(path, shared=True, size=n + world_size, dtype=torch.float32)
    params, counts = shared[:n], shared[n:]
    hist = _History(params, X, y, cfg) if rank == 0 else None  # before the barrier: see _History
    dist.barrier()
    for step in range(cfg.steps):
        idx = batch_indices(cfg, rank, step, len(X))
        _, grad = loss_and_grad(params, X[idx], y[idx], cfg.hidden)  # reads a racy snapshot
        _straggle(cfg, rank, world_size)
        params.sub_(cfg.lr * grad)                 # lock-free write, racing with other ranks
        counts[rank] += len(idx)                   # only this rank writes its own counter
        if rank == 0 and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
            hist.add(int(counts.sum()), params)
    dist.barrier()                                 # every rank has applied all its updates
    if rank != 0:
        return None
    hist.add(int(counts.sum()), params)
    return hist.result("Hogwild", params)


def with_(cfg, **changes):
    """A copy of ``cfg`` with some fields changed (``dataclasses.replace``)."""
    return replace(cfg, **changes)
