"""The same pipeline with PyTorch's own ``torch.distributed.pipelining`` (06a2): GPipe, 1F1B and
the schedules with several stages per rank (interleaved 1F1B, zero bubble), on the stages of
``pipeline``, checked against one process. Launching and measuring them is
``experiments.pipeline_runs``.

With v stages per rank the model is cut into v * p stages. Looped schedules (interleaved 1F1B,
interleaved zero bubble) give rank r the stages r, r + p, r + 2p, ...; the "V" schedule (ZBV)
gives rank r the stages r and 2p - 1 - r, so the first and last stage share rank 0.
"""
from __future__ import annotations

import torch
from torch import nn

from labutils.parallel.model_parallel import split_model
from labutils.parallel.pipeline import validate_config

# name -> (class in torch.distributed.pipelining, stages per rank, placement)
SCHEDULES = {
    "gpipe": ("ScheduleGPipe", 1, "loop"),
    "1f1b": ("Schedule1F1B", 1, "loop"),
    "interleaved_1f1b": ("ScheduleInterleaved1F1B", 2, "loop"),
    "zero_bubble": ("ScheduleInterleavedZeroBubble", 2, "loop"),
    "zbv": ("ScheduleZBVZeroBubble", 2, "v"),
}


def interleaved_bubble(n_stages, n_microbatches, stages_per_rank=1):
    """Idle share of interleaved 1F1B with v stages per rank: (p-1)/(v*m + p-1).

    Narayanan et al. 2021 (Megatron-LM, SC21), section 2.2.2: the bubble time over the ideal
    time is (p-1)/(v*m); as a share of the whole step that is (p-1)/(v*m + p-1). v = 1 is
    GPipe's and 1F1B's (p-1)/(m+p-1).
    """
    p, m, v = n_stages, n_microbatches, stages_per_rank
    return (p - 1) / (v * m + p - 1)


def stage_ids(schedule, rank, world_size):
    """The stages (0 .. v*p - 1) that ``rank`` holds under ``schedule``."""
    _, v, placement = SCHEDULES[schedule]
    if placement == "v":
        return [rank, 2 * world_size - 1 - rank]
    return [rank + k * world_size for k in range(v)]


def build_schedule(schedule, rank, world_size, model_fn, n_microbatches):
    """In a rank: this rank's stages of a fresh model, wrapped in ``PipelineStage``s and driven
    by the schedule. Returns (schedule, stage modules, holds the first stage, holds the last)."""
    # seconds to import: only in the ranks that use it
    from torch.distributed import pipelining
    class_name, v, _ = SCHEDULES[schedule]
    stages = split_model(model_fn(), v * world_size)
    ids = stage_ids(schedule, rank, world_size)
    mine = [stages[i] for i in ids]
    wrapped = [pipelining.PipelineStage(stages[i], i, v * world_size, torch.device("cpu"))
               for i in ids]
    # scale_grads (the default) divides the summed micro-batch gradients by m: our loss / m
    schedule_cls = getattr(pipelining, class_name)
    pipe = schedule_cls(wrapped if v > 1 else wrapped[0], n_microbatches,
                        loss_fn=nn.functional.mse_loss)
    return pipe, mine, 0 in ids, v * world_size - 1 in ids


def schedule_order(pipe):
    """The schedule's compute actions per rank as (kind, stage, microbatch), kind in F B I W,
    from its ``pipeline_order``."""
    order = pipe.pipeline_order
    return [[(_KINDS[a.computation_type.name], a.stage_index, a.microbatch_index)
             for a in order[r] if a is not None and a.computation_type.name in _KINDS]
            for r in sorted(order)]


_KINDS = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}


def validate_schedules(n_layers, world_size, batch_size, n_microbatches, schedules):
    """Refuse unknown schedules and bad splits before any process starts."""
    for schedule in schedules:
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")
        v = SCHEDULES[schedule][1]
        validate_config(n_layers, v * world_size, batch_size, n_microbatches, "gpipe")
