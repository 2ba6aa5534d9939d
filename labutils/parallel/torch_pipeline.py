"""The same pipeline with PyTorch's own ``torch.distributed.pipelining`` (06a): GPipe and 1F1B
schedules on the stages of ``pipeline``, checked against one process."""
from __future__ import annotations

import torch
from torch import nn

from labutils.core.launcher import launch
from labutils.parallel.model_parallel import sgd_step, split_model
from labutils.parallel.pipeline import validate_config


def torch_pipeline_worker(rank, world_size, model_fn, x, y, schedules=("gpipe", "1f1b"),
                          n_microbatches=4, sizes=None, steps=1, lr=0.05):
    """PyTorch's ``PipelineStage`` + ``ScheduleGPipe`` / ``Schedule1F1B`` on our stages.

    Several schedules run in one launch (each from a fresh model), because importing
    ``torch.distributed.pipelining`` costs every new rank seconds. Returns {schedule: dict}.
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    out = {}
    for schedule in schedules:
        stage = split_model(model_fn(), world_size, sizes)[rank]
        pipe_stage = PipelineStage(stage, rank, world_size, torch.device("cpu"))
        schedule_cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
        # scale_grads (the default) divides the summed micro-batch gradients by m: our loss / m
        pipe = schedule_cls(pipe_stage, n_microbatches, loss_fn=nn.functional.mse_loss)
        losses, grads = [], None
        for _ in range(steps):
            if rank == 0:
                pipe.step(x)
            elif rank == world_size - 1:
                mb_losses = []
                pipe.step(target=y, losses=mb_losses)
                losses.append(float(sum(l.detach() for l in mb_losses)) / n_microbatches)
            else:
                pipe.step()
            if grads is None:
                grads = {n: p.grad.clone() for n, p in stage.named_parameters()}
            sgd_step(stage, lr)
        out[schedule] = {"losses": losses, "grads": grads,
                         "params": {n: p.detach().clone() for n, p in stage.named_parameters()}}
    return out


def run_torch_pipeline(model_fn, x, y, world_size=2, schedules=("gpipe", "1f1b"),
                       n_microbatches=4, sizes=None, steps=1, lr=0.05, timeout=180.0):
    """Validate, then launch PyTorch's pipeline: {schedule: per-rank result dicts}."""
    for schedule in schedules:
        if schedule not in ("gpipe", "1f1b"):
            raise ValueError(f"schedules may hold 'gpipe' and '1f1b'; got {schedule!r}")
    sizes = validate_config(len(model_fn()), world_size, x.shape[0], n_microbatches, "gpipe", sizes)
    per_rank = launch(torch_pipeline_worker, model_fn, x, y, schedules=tuple(schedules),
                      n_microbatches=n_microbatches, sizes=sizes, steps=steps, lr=lr,
                      world_size=world_size, timeout=timeout)
    return {s: [r[s] for r in per_rank] for s in schedules}
