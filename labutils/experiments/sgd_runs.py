"""The runs of lab 03b (and 03d, 03e1): validate the inputs, then launch the workers of
``labutils.parallel.async_sgd`` (sync all-reduce SGD, a parameter server, Hogwild) on real
ranks; each returns rank 0's history (``async_sgd`` says what it holds)."""
from __future__ import annotations

import os
import tempfile

import torch

from labutils.core.launcher import launch
from labutils.parallel.async_sgd import (
    SGDConfig,
    hogwild_worker,
    init_params,
    parameter_server_worker,
    sync_sgd_worker,
)


def _launch(worker, world_size, *args, warn=False):
    # a rank that mostly sleeps or waits needs no core of its own; ``warn`` where times are read
    return launch(worker, *args, world_size=world_size, timeout=300, warn_oversubscription=warn)


def validate_inputs(X, y, cfg, world_size, minimum):
    cfg.validate()
    if not isinstance(world_size, int) or world_size < minimum:
        raise ValueError(f"world_size must be an int >= {minimum} here; got {world_size!r}")
    if X.ndim != 2 or len(X) != len(y):
        raise ValueError(f"X must be (N, features) and y (N,); got {tuple(X.shape)} and "
                         f"{tuple(y.shape)} (flatten images with X.flatten(1))")
    return X.float(), y.long()


def run_sync(X, y, cfg=SGDConfig(), world_size=2, warn=False):
    """``warn``: warn when the ranks outnumber the cores (for runs whose times are read)."""
    X, y = validate_inputs(X, y, cfg, world_size, 1)
    return _launch(sync_sgd_worker, world_size, X, y, cfg, warn=warn)[0]


def run_parameter_server(X, y, cfg=SGDConfig(), world_size=3, warn=False):
    """``world_size`` ranks: one server and ``world_size - 1`` workers."""
    X, y = validate_inputs(X, y, cfg, world_size, 2)
    return _launch(parameter_server_worker, world_size, X, y, cfg, warn=warn)[0]


def run_hogwild(X, y, cfg=SGDConfig(), world_size=2, warn=False):
    X, y = validate_inputs(X, y, cfg, world_size, 1)
    init = torch.cat([init_params(X.shape[1], 10, cfg), torch.zeros(world_size)])  # + counters
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else None  # RAM-backed where there is one
    fd, path = tempfile.mkstemp(prefix="lu-hogwild-", dir=folder)
    os.close(fd)
    try:
        torch.from_file(path, shared=True, size=init.numel(), dtype=torch.float32).copy_(init)
        return _launch(hogwild_worker, world_size, X, y, cfg, path, warn=warn)[0]
    finally:
        os.unlink(path)
