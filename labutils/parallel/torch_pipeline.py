"""The same pipeline with PyTorch's own ``torch.distributed.pipelining`` (06a): GPipe, 1F1B and
the schedules with several stages per rank (interleaved 1F1B, zero bubble), on the stages of
``pipeline``, checked against one process.

With v stages per rank the model is cut into v * p stages. Looped schedules (interleaved 1F1B,
interleaved zero bubble) give rank r the stages r, r + p, r + 2p, ...; the "V" schedule (ZBV)
gives rank r the stages r and 2p - 1 - r, so the first and last stage share rank 0.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from labutils.core.launcher import launch
from labutils.core.rank import progress
from labutils.core.timeline import Timeline
from labutils.parallel.emulated_stages import recording
from labutils.parallel.model_parallel import sgd_step, split_model
from labutils.parallel.pipeline import SavedBytes, validate_config

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


def torch_pipeline_worker(rank, world_size, model_fn, x, y, schedules=("gpipe", "1f1b"),
                          n_microbatches=4, steps=1, lr=0.05):
    """PyTorch's ``PipelineStage`` and schedules on our stages, ``steps`` SGD steps each.

    Several schedules run in one launch, their steps interleaved (A B C A B C ...) so that
    machine noise hits all alike, each from a fresh model; importing
    ``torch.distributed.pipelining`` costs every new rank seconds. Returns {schedule: dict} with
    ``losses`` (on the rank holding the last stage), ``grads`` after the first step, ``params``
    after the last, the ``order`` of its actions on every rank, and per step the ``work_spans`` (emulated work) and ``peak_saved_bytes``
    (``SavedBytes``: activations held for backward, most at any one time on this rank).
    """
    built = {s: build_schedule(s, rank, world_size, model_fn, n_microbatches) for s in schedules}
    out = {s: {"losses": [], "grads": None, "work_spans": [], "peak_saved_bytes": []}
           for s in schedules}
    for step in range(steps):
        progress(step + 1, steps, "steps")
        for schedule, (pipe, mine, has_first, has_last) in built.items():
            memory, mb_losses = SavedBytes(mine), []
            dist.barrier()                      # every rank starts the step together
            with recording(Timeline(rank)) as work, memory.saving():
                pipe.step(x if has_first else None, target=y if has_last else None,
                          losses=mb_losses if has_last else None)
            res = out[schedule]
            if has_last:
                res["losses"].append(float(sum(l.detach() for l in mb_losses)) / n_microbatches)
            if res["grads"] is None:
                res["grads"] = {n: p.grad.clone() for m in mine for n, p in m.named_parameters()}
            res["work_spans"].append(work.spans)
            res["peak_saved_bytes"].append(memory.peak_bytes)
            for m in mine:
                sgd_step(m, lr)
    for schedule, (pipe, mine, _, _) in built.items():
        out[schedule]["params"] = {n: p.detach().clone() for m in mine
                                   for n, p in m.named_parameters()}
        # GPipe and 1F1B run their own loop; their pipeline_order is a description (in torch
        # 2.13 it numbers rank 1's micro-batches of Schedule1F1B from 1), so keep only orders
        # that the schedule runs: those with several stages per rank
        out[schedule]["order"] = _order(pipe) if SCHEDULES[schedule][1] > 1 else None
    return out


def _order(pipe):
    """The schedule's compute actions per rank as (kind, stage, microbatch), kind in F B I W,
    from its ``pipeline_order``."""
    order = pipe.pipeline_order
    return [[(_KINDS[a.computation_type.name], a.stage_index, a.microbatch_index)
             for a in order[r] if a is not None and a.computation_type.name in _KINDS]
            for r in sorted(order)]


_KINDS = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}


def run_torch_pipeline(model_fn, x, y, world_size=2, schedules=("gpipe", "1f1b"),
                       n_microbatches=4, steps=1, lr=0.05, timeout=180.0,
                       warn_oversubscription=True):
    """Validate, then launch PyTorch's pipeline: {schedule: per-rank result dicts}."""
    n_layers = len(model_fn())
    for schedule in schedules:
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")
        v = SCHEDULES[schedule][1]
        validate_config(n_layers, v * world_size, x.shape[0], n_microbatches, "gpipe")
    per_rank = launch(torch_pipeline_worker, model_fn, x, y, schedules=tuple(schedules),
                      n_microbatches=n_microbatches, steps=steps, lr=lr, world_size=world_size,
                      timeout=timeout, warn_oversubscription=warn_oversubscription)
    return {s: [r[s] for r in per_rank] for s in schedules}
