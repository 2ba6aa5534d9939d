"""Memory per rank of naive model parallelism (05): the formula for what each stage holds at
its peak, beside the peak measured inside each rank (``lu.memory.measure_peak``)."""
from __future__ import annotations

import torch

from labutils.core.memory import TERMS, model_memory
from labutils.parallel.model_parallel import (
    run_naive_model_parallel,
    single_process_peak,
    split_model,
)


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
        # A correctness-style run: it times nothing, so no oversubscription warning.
        results = run_naive_model_parallel(model_fn, x, y, world_size=ws, measure_memory=True,
                                           warn_oversubscription=False)
        rows[ws] = list(zip(stage_formulas(model_fn, x, ws), [r["peak_bytes"] for r in results]))
    return rows
