"""Synchronous vs asynchronous SGD on real ranks: all-reduce SGD, a parameter server, Hogwild.

Used by ``03a_parallelism_concepts`` (sync vs async, stragglers, staleness) and
``03c_challenges`` (stale updates as a data-inconsistency problem).

The model is a small MLP on the digits whose parameters live in ONE flat fp32 vector, so a
rank can send, receive or share all of them as a single tensor. Every run returns a history
of the full training-set loss against examples processed and against wall time (time spent
evaluating the loss is left out of the clock).

* ``sync_sgd_worker``: every step, each rank computes a gradient on its own mini-batch,
  all-reduces it and applies the mean: equal, step for step, to single-process SGD on the union
  of the batches (``reference_sgd``). A straggler holds every rank back.
* ``parameter_server_worker``: rank 0 keeps the weights; ranks 1.. pull weights, compute a
  gradient and push it without waiting for each other (Dean et al., "Large Scale Distributed
  Deep Networks", NeurIPS 2012). The server applies gradients in arrival order, so a gradient
  may have been computed on weights several updates old: its *staleness*, recorded per update.
* ``hogwild_worker``: no server and no lock; every rank reads and writes one weight vector in
  shared memory (Recht et al., "Hogwild!", NeurIPS 2011).
The single-process simulation with a fixed staleness, for the intuition behind the measured
parameter-server points, is ``labutils.experiments.staleness.delayed_sgd``.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labutils.core.env import one_thread
from labutils.core.launcher import launch
from labutils.core.rank import progress


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


# ---- the model: an MLP whose parameters are one flat vector ---------------------------------

def _shapes(n_in, hidden, n_out):
    return [(n_in, hidden), (hidden,), (hidden, n_out), (n_out,)]


def init_params(n_in, n_out, cfg):
    """The flat initial parameter vector (the same on every rank: seeded)."""
    g = torch.Generator().manual_seed(cfg.seed)
    parts = []
    for shape in _shapes(n_in, cfg.hidden, n_out):
        fan_in = shape[0] if len(shape) == 2 else cfg.hidden
        parts.append((torch.rand(shape, generator=g) * 2 - 1).flatten() / fan_in ** 0.5)
    return torch.cat(parts)


def _forward(params, X, hidden, n_out):
    W1, b1, W2, b2 = torch.split(params, [X.shape[1] * hidden, hidden, hidden * n_out, n_out])
    h = F.relu(X @ W1.view(X.shape[1], hidden) + b1)      # (B, hidden)
    return h @ W2.view(hidden, n_out) + b2                 # (B, n_out)


def loss_and_grad(params, X, y, hidden, n_out=10):
    """Mean cross-entropy of the batch and its gradient, on a snapshot of ``params``."""
    p = params.detach().clone().requires_grad_(True)  # a snapshot: others may write params now
    loss = F.cross_entropy(_forward(p, X, hidden, n_out), y)
    (grad,) = torch.autograd.grad(loss, p)
    return loss.item(), grad


def full_loss(params, X, y, hidden, n_out=10):
    with torch.no_grad():
        return F.cross_entropy(_forward(params, X, hidden, n_out), y).item()


def accuracy(params, X, y, hidden, n_out=10):
    """Share of ``X`` classified correctly by the MLP with parameters ``params``."""
    with torch.no_grad():
        return (_forward(params, X, hidden, n_out).argmax(1) == y).float().mean().item()


def batch_indices(cfg, worker, step, n):
    """The mini-batch worker ``worker`` draws at ``step``: fixed by the seed, so runs repeat."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + worker * 10_007 + step)
    return torch.randint(0, n, (cfg.batch_size,), generator=g)


class _History:
    """Full-loss points against examples processed and wall time, evaluation time excluded."""

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
                    params=params.clone(), **extra)


def _straggle(cfg, rank, world_size):
    if cfg.delay and rank == world_size - 1:
        time.sleep(cfg.delay)


# ---- synchronous all-reduce SGD -------------------------------------------------------------

def sync_sgd_worker(rank, world_size, X, y, cfg):
    """Every rank: gradient on its own batch, all-reduce, mean, the same update everywhere."""
    params = init_params(X.shape[1], 10, cfg)
    dist.barrier()
    hist = _History(params, X, y, cfg) if rank == 0 else None
    for step in range(cfg.steps):
        progress(step + 1, cfg.steps, "steps")  # rank 0 drives a panel's bar
        idx = batch_indices(cfg, rank, step, len(X))
        _, grad = loss_and_grad(params, X[idx], y[idx], cfg.hidden)
        _straggle(cfg, rank, world_size)
        wire = grad.to(getattr(torch, cfg.compress))  # compression: fewer bytes on the wire
        dist.all_reduce(wire)            # everyone waits here for the slowest rank
        params -= cfg.lr * wire.float() / world_size
        if rank == 0 and (step + 1) % cfg.eval_every == 0:
            hist.add((step + 1) * world_size * cfg.batch_size, params)
    return hist.result("sync all-reduce", params) if rank == 0 else None


def reference_sgd(X, y, cfg, world_size, first_rank=0):
    """Single-process SGD on the union of the batches of ranks ``first_rank ..
    first_rank + world_size - 1``: what sync SGD must equal."""
    with one_thread():
        return _reference_sgd(X, y, cfg, range(first_rank, first_rank + world_size))


def _reference_sgd(X, y, cfg, ranks):
    params = init_params(X.shape[1], 10, cfg)
    for step in range(cfg.steps):
        progress(step + 1, cfg.steps, "steps")  # the caller drives a panel's bar
        idx = torch.cat([batch_indices(cfg, r, step, len(X)) for r in ranks])
        _, grad = loss_and_grad(params, X[idx], y[idx], cfg.hidden)
        params -= cfg.lr * grad
    return params


# ---- asynchronous: a parameter server -------------------------------------------------------

def parameter_server_worker(rank, world_size, X, y, cfg):
    """Rank 0 serves the weights; ranks 1.. push gradients and pull weights, never waiting for
    one another. A message is the flat vector plus one slot: the weights' version number (or
    -1, "stop"). The server applies ``steps * workers`` gradients from whoever sends them, so
    a straggler simply contributes fewer."""
    n = init_params(X.shape[1], 10, cfg).numel()
    workers = world_size - 1
    if rank == 0:
        params, version = init_params(X.shape[1], 10, cfg), 0
        dist.barrier()
        hist = _History(params, X, y, cfg)
        for w in range(1, world_size):                      # everyone's first pull
            dist.send(torch.cat([params, torch.tensor([0.0])]), w)
        msg, staleness, pushes = torch.empty(n + 1), [], [0] * world_size
        active = workers
        while active:
            src = dist.recv(msg)                             # whoever pushes first is served
            if version == cfg.steps * workers:               # done: tell this worker to stop
                dist.send(torch.cat([params, torch.tensor([-1.0])]), src)
                active -= 1
                continue
            staleness.append(version - int(msg[n]))          # updates since its weights
            params -= cfg.lr * msg[:n]
            version += 1
            pushes[src] += 1
            dist.send(torch.cat([params, torch.tensor([float(version)])]), src)
            if version % (cfg.eval_every * workers) == 0:
                hist.add(version * cfg.batch_size, params)
        return hist.result("parameter server", params, staleness=staleness,
                           pushes=pushes[1:])
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
        dist.send(torch.cat([grad, msg[n:]]), 0)             # push, tagged with its version
        step += 1


# ---- asynchronous: Hogwild on shared memory --------------------------------------------------

def hogwild_worker(rank, world_size, X, y, cfg, path):
    """Every rank updates the weights in the shared file ``path`` in place, with no lock."""
    n = init_params(X.shape[1], 10, cfg).numel()
    # Mapped from a file by name: a tensor passed as an argument would arrive as a copy.
    params = torch.from_file(path, shared=True, size=n, dtype=torch.float32)
    dist.barrier()
    hist = _History(params, X, y, cfg) if rank == 0 else None
    for step in range(cfg.steps):
        progress(step + 1, cfg.steps, "steps")  # rank 0 drives a panel's bar
        idx = batch_indices(cfg, rank, step, len(X))
        _, grad = loss_and_grad(params, X[idx], y[idx], cfg.hidden)  # reads a racy snapshot
        _straggle(cfg, rank, world_size)
        params.sub_(cfg.lr * grad)                 # lock-free write, racing with other ranks
        if rank == 0 and (step + 1) % cfg.eval_every == 0:
            hist.add((step + 1) * world_size * cfg.batch_size, params)
    dist.barrier()
    return hist.result("Hogwild", params) if rank == 0 else None


# ---- callers: validate, then launch ---------------------------------------------------------

def _launch(worker, world_size, *args):
    # a rank that mostly sleeps or waits needs no core of its own
    return launch(worker, *args, world_size=world_size, timeout=300, warn_oversubscription=False)


def validate_inputs(X, y, cfg, world_size, minimum):
    cfg.validate()
    if not isinstance(world_size, int) or world_size < minimum:
        raise ValueError(f"world_size must be an int >= {minimum} here; got {world_size!r}")
    if X.ndim != 2 or len(X) != len(y):
        raise ValueError(f"X must be (N, features) and y (N,); got {tuple(X.shape)} and "
                         f"{tuple(y.shape)} (flatten images with X.flatten(1))")
    return X.float(), y.long()


def run_sync(X, y, cfg=SGDConfig(), world_size=2):
    X, y = validate_inputs(X, y, cfg, world_size, 1)
    return _launch(sync_sgd_worker, world_size, X, y, cfg)[0]


def run_parameter_server(X, y, cfg=SGDConfig(), world_size=3):
    """``world_size`` ranks: one server and ``world_size - 1`` workers."""
    X, y = validate_inputs(X, y, cfg, world_size, 2)
    return _launch(parameter_server_worker, world_size, X, y, cfg)[0]


def run_hogwild(X, y, cfg=SGDConfig(), world_size=2):
    X, y = validate_inputs(X, y, cfg, world_size, 1)
    init = init_params(X.shape[1], 10, cfg)
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else None  # RAM-backed where there is one
    fd, path = tempfile.mkstemp(prefix="lu-hogwild-", dir=folder)
    os.close(fd)
    try:
        torch.from_file(path, shared=True, size=init.numel(), dtype=torch.float32).copy_(init)
        return _launch(hogwild_worker, world_size, X, y, cfg, path)[0]
    finally:
        os.unlink(path)


def with_(cfg, **changes):
    """A copy of ``cfg`` with some fields changed (``dataclasses.replace``)."""
    return replace(cfg, **changes)
