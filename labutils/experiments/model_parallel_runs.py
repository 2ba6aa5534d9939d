"""Naive model parallelism and the split matmuls of 05 on real ranks, observed from outside.

``run_naive_model_parallel`` trains with ``parallel.model_parallel``'s forward and backward
halves, one stage per rank, and watches each step from outside: a timeline of the stage's
forward and backward (``stage_observers.stage_spans``) and, in the first step, every message
the rank sends or receives (``lu.commcount.count_collectives``: op, bytes, peer).
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from labutils.core.commcount import count_collectives
from labutils.core.launcher import launch
from labutils.core.timeline import Timeline
from labutils.experiments.stage_observers import stage_spans
from labutils.parallel.model_parallel import (
    boundary_shapes,
    naive_backward,
    naive_model_parallel_worker,
    naive_train_step,
    split_model,
)
from labutils.parallel.split_matmul import column_parallel_matmul, row_parallel_matmul


def observed_naive_worker(rank, world_size, model_fn, x, y, shapes, sizes=None, steps=1,
                          lr=0.05, backward_fn=naive_backward):
    """``naive_model_parallel_worker``'s own loop, each step observed. Returns its dict plus
    ``spans`` (forward and backward of every step), ``step_spans`` (the spans of each step) and
    ``messages``, the ``Call``s of the first step (``count_collectives``: counting adds Python
    work, so only the first step pays it)."""
    tl = Timeline(rank)
    bounds, messages = [], []

    def train_step(layout, stage, *args):
        first = len(tl.spans)
        if not bounds:                        # the first step: start the clocks together
            observers.enter_context(stage_spans(stage, tl))
            dist.barrier()
            with count_collectives() as counted:
                result = naive_train_step(layout, stage, *args)
            messages.extend(counted.calls)
        else:
            result = naive_train_step(layout, stage, *args)
        bounds.append((first, len(tl.spans)))
        return result

    with contextlib.ExitStack() as observers:
        result = naive_model_parallel_worker(rank, world_size, model_fn, x, y, shapes,
                                             sizes=sizes, steps=steps, lr=lr,
                                             backward_fn=backward_fn, train_step=train_step)
    return {**result, "spans": tl.spans, "step_spans": [tl.spans[a:b] for a, b in bounds],
            "messages": messages}


def run_naive_model_parallel(model_fn, x, y, world_size=2, sizes=None, steps=1, lr=0.05,
                             backward_fn=naive_backward, timeout=60.0,
                             warn_oversubscription=True):
    """Check the split, then launch one observed stage per rank; the per-rank result dicts.
    ``warn_oversubscription=False`` for runs that time nothing (see ``lu.launch``)."""
    stages = split_model(model_fn(), world_size, sizes)   # raises before any process starts
    shapes = boundary_shapes(stages, x)
    return launch(observed_naive_worker, model_fn, x, y, shapes, sizes=sizes, steps=steps,
                  lr=lr, backward_fn=backward_fn, world_size=world_size, timeout=timeout,
                  warn_oversubscription=warn_oversubscription)


def run_split_matmul(x, w, world_size=2, how="column"):
    """Check shapes, then run one split matmul on real ranks; returns each rank's y."""
    fns = {"column": column_parallel_matmul, "row": row_parallel_matmul}
    if how not in fns:
        raise ValueError(f"how must be 'column' or 'row'; got {how!r}")
    dim, what = (w.shape[1], "columns of w") if how == "column" else (w.shape[0], "rows of w")
    if x.shape[1] != w.shape[0]:
        raise ValueError(f"x {tuple(x.shape)} @ w {tuple(w.shape)}: inner sizes differ")
    if dim % world_size:
        raise ValueError(f"{dim} {what} cannot be split evenly over {world_size} ranks: use a "
                         f"world_size dividing {dim}")
    return launch(fns[how], x, w, world_size=world_size)
