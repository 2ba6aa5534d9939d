"""Staleness in lab 03b: simulated in one process (``delayed_sgd``), replayed exactly from a real
parameter-server run's trace (``replay_parameter_server``), and the controls that separate what
asynchrony costs from what the number of updates does (``straggler_runs``). The real
asynchronous runs are ``labutils.parallel.async_sgd``."""
from __future__ import annotations

import collections
import random
import time

from labutils.core.env import one_thread
from labutils.core.i18n import N_
from labutils.core.rank import progress
from labutils.experiments.sgd_runs import (
    run_hogwild,
    run_parameter_server,
    run_sync,
    validate_inputs,
)
from labutils.parallel.async_sgd import reference_sgd, with_
from labutils.parallel.flat_mlp import (
    batch_indices,
    full_loss,
    init_params,
    loss_and_grad,
)


def delayed_sgd(X, y, cfg, staleness):
    """Single-process simulation: step t applies the gradient taken at the weights of step
    t - ``staleness``. Deterministic; returns the same history as the real runs (no time)."""
    X, y = validate_inputs(X, y, cfg, 1, 1)
    with one_thread():
        return _delayed_sgd(X, y, cfg, staleness)


def _delayed_sgd(X, y, cfg, staleness):
    params = init_params(X.shape[1], 10, cfg)
    old = collections.deque([params.clone()], maxlen=staleness + 1)
    points = [(0, full_loss(params, X, y, cfg.hidden))]
    for step in range(cfg.steps):
        progress(step + 1, cfg.steps, "steps")  # the caller drives a panel's bar
        idx = batch_indices(cfg, 0, step, len(X))
        _, grad = loss_and_grad(old[0], X[idx], y[idx], cfg.hidden)
        params -= cfg.lr * grad
        old.append(params.clone())
        if (step + 1) % cfg.eval_every == 0:
            points.append(((step + 1) * cfg.batch_size, full_loss(params, X, y, cfg.hidden)))
    ex, ls = zip(*points)
    return dict(name=f"staleness {staleness}", examples=list(ex), loss=list(ls), params=params)


def replay_parameter_server(X, y, cfg, trace):
    """One process replays a real parameter-server run from its ``trace`` (worker, worker step,
    weights' version, per update): update v applies the gradient of that worker's batch taken
    at the weights of that version. It must equal the run's final weights: the server's
    asynchrony is nothing but this sequence of (batch, staleness) pairs."""
    X, y = validate_inputs(X, y, cfg, 1, 1)
    with one_thread():
        versions = [init_params(X.shape[1], 10, cfg)]
        for k, (worker, step, version) in enumerate(trace):
            progress(k + 1, len(trace), "updates")
            idx = batch_indices(cfg, worker, step, len(X))
            _, grad = loss_and_grad(versions[version], X[idx], y[idx], cfg.hidden)
            versions.append(versions[-1] - cfg.lr * grad)
        return versions[-1]


def with_fixed_staleness(trace, staleness):
    """The same batches in the same order, every gradient exactly ``staleness`` updates old (at
    w_0 while fewer updates exist). Staleness 0 is serial SGD on the run's own batches: replayed,
    it is the run without its asynchrony."""
    return [(w, step, max(0, k - staleness)) for k, (w, step, _) in enumerate(trace)]


def round_robin(workers, steps, first_rank=0):
    """A staleness-0 trace that takes step 0 of every worker, then step 1, ...: replayed, it is
    serial small-batch SGD on the batches of ``workers`` ranks from ``first_rank``."""
    order = [(r, s) for s in range(steps) for r in range(first_rank, first_rank + workers)]
    return [(r, s, k) for k, (r, s) in enumerate(order)]


def shuffled_order(workers, steps, seed, first_rank=0):
    """A staleness-0 trace of the same batches as ``round_robin`` in a random interleaving
    (each worker's own steps stay in order): replayed, serial small-batch SGD in another
    batch order. Seeded, so it repeats."""
    left, rng, order = {r: 0 for r in range(first_rank, first_rank + workers)}, \
        random.Random(seed), []
    while left:
        r = rng.choice(sorted(left))
        order.append((r, left[r]))
        left[r] += 1
        if left[r] == steps:
            del left[r]
    return [(r, s, k) for k, (r, s) in enumerate(order)]


def staleness_of(run, worker):
    """How many updates old each gradient of ``worker`` was, counted from the run's trace: the
    update's index minus the version its gradient was taken at."""
    return [k - version for k, (w, _, version) in enumerate(run["trace"]) if w == worker]


def straggler_runs(X, y, cfg, workers=2, repeats=7, orders=20):
    """Sync all-reduce (at ``workers * lr``: the same step per example), a parameter server and
    Hogwild, each with the straggler's ``cfg.delay`` and without it, interleaved ``repeats``
    times (round i of every variant met the same machine load). Each run gets
    ``launch_s`` (its time outside the ranks' clock) and, for the server, ``serial_loss``:
    the final loss of its own trace replayed at staleness 0. Also returned, one process each:
    serial large-batch SGD (sync's reference) and serial small-batch SGD (``W * S`` updates of
    one batch: Hogwild's reference, round robin) and ``serial_orders_loss``: its final losses
    over ``orders`` random interleavings of Hogwild's batches (``shuffled_order``), the spread
    batch order alone gives."""
    fast = with_(cfg, delay=0.0)
    big = lambda c: with_(c, lr=workers * c.lr)      # the linear scaling rule
    variants = {
        N_("sync"): lambda c: run_sync(X, y, big(c), world_size=workers, warn=True),
        N_("parameter server"): lambda c: run_parameter_server(X, y, c, world_size=workers + 1,
                                                           warn=True),  # + the server
        "Hogwild": lambda c: run_hogwild(X, y, c, world_size=workers, warn=True),
    }
    runs = {(name, d): [] for d in (N_("straggler"), N_("no straggler")) for name in variants}
    for i in range(repeats):                         # interleaved: noise hits every variant
        for (name, d), rs in runs.items():
            t0 = time.perf_counter()
            r = variants[name](cfg if d == "straggler" else fast)
            r["launch_s"] = time.perf_counter() - t0 - r["time"][-1] - r["eval_s"]
            rs.append(r)
        progress(i + 1, repeats, "repeats")
    for d in ("straggler", "no straggler"):         # after the clocks: the asynchrony's control
        for r in runs[("parameter server", d)]:
            r["serial_loss"] = full_loss(replay_parameter_server(
                X, y, cfg, with_fixed_staleness(r["trace"], 0)), X, y, cfg.hidden)
    X, y = validate_inputs(X, y, cfg, workers, 1)
    large = reference_sgd(X, y, big(cfg), workers)
    small = replay_parameter_server(X, y, cfg, round_robin(workers, cfg.steps))
    return dict(runs=runs, workers=workers, cfg=cfg, serial_large=large, serial_small=small,
                serial_large_loss=full_loss(large, X, y, cfg.hidden),
                serial_small_loss=full_loss(small, X, y, cfg.hidden),
                serial_orders_loss=[full_loss(replay_parameter_server(
                    X, y, cfg, shuffled_order(workers, cfg.steps, seed)), X, y, cfg.hidden)
                    for seed in range(orders)])
