"""Memory per rank of naive model parallelism (05): the formula for what each stage holds at
its peak, beside the peak measured inside each rank (``lu.memory.measure_peak`` around one
training step of ``parallel.model_parallel``, from outside)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from labutils.core.launcher import launch
from labutils.core.memory import TERMS, measure_peak, model_memory
from labutils.parallel.model_parallel import (
    StageLayout,
    boundary_shapes,
    naive_train_step,
    split_model,
)


def weight_bytes(module):
    return sum(p.numel() * p.element_size() for p in module.parameters())


def single_process_peak(model_fn, x, y):
    """Weights plus the measured peak of forward + backward of the whole model, one process."""
    model = model_fn()
    _, peak = measure_peak(lambda: nn.functional.mse_loss(model(x), y).backward())
    return weight_bytes(model) + peak


def _stage_peak(rank, world_size, model_fn, x, y, shapes):
    stage = split_model(model_fn(), world_size)[rank]
    dist.barrier()
    _, peak = measure_peak(naive_train_step, StageLayout(rank, world_size), stage, x, y,
                           shapes[rank])                 # forward + backward
    return weight_bytes(stage) + peak


def stage_peaks(model_fn, x, y, world_size=2):
    """Each rank's weights plus the measured peak of one training step of its stage."""
    shapes = boundary_shapes(split_model(model_fn(), world_size), x)   # bad splits raise here
    # A correctness-style run: it times nothing, so no oversubscription warning.
    return launch(_stage_peak, model_fn, x, y, shapes, world_size=world_size,
                  warn_oversubscription=False)


def stage_formulas(model_fn, x, world_size):
    """``lu.memory.model_memory`` (SGD, fresh gradients) of each stage on the input it receives.

    A stage other than the last also holds the gradient it received (d loss / d output) for
    the whole of its backward pass: ``naive_backward`` keeps it to back-propagate from.
    """
    stages = split_model(model_fn(), world_size)
    out, stage_input = [], x
    for rank, stage in enumerate(stages):
        est = model_memory(stage, optimizer="sgd", example_input=stage_input, gradients="fresh")
        with torch.no_grad():
            output = stage(stage_input)
        if rank < world_size - 1:
            est["temporary"] += output.nbytes           # the received gradient, held
            est["total"] = sum(est[t] for t in TERMS)
        out.append(est)
        stage_input = output.requires_grad_()           # the next stage's input needs a grad
    return out


def formula_vs_measured(model_fn, x, y, world_sizes=(1, 2, 4)):
    """{world_size: [(formula dict, measured peak bytes) per rank]}; 1 is one process."""
    rows = {}
    for ws in world_sizes:
        if ws == 1:
            est = model_memory(model_fn(), optimizer="sgd", example_input=x, gradients="fresh")
            rows[ws] = [(est, single_process_peak(model_fn, x, y))]
            continue
        rows[ws] = list(zip(stage_formulas(model_fn, x, ws), stage_peaks(model_fn, x, y, ws)))
    return rows
