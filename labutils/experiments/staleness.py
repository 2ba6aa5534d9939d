"""Staleness simulated in one process (03b): step t applies the gradient taken at the weights of
step t - k, so the effect of delay is seen without timing noise, deterministically. Simulated,
not measured: the real asynchronous runs are ``labutils.parallel.async_sgd``."""
from __future__ import annotations

import collections

from labutils.core.env import one_thread
from labutils.core.rank import progress
from labutils.experiments.sgd_runs import validate_inputs
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
