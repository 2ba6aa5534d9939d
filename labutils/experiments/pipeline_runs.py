"""Running the pipelines of 06a1 and 06a2 on real ranks, observed from outside.

``run_pipeline`` launches ``parallel.pipeline.pipeline_worker`` as it is: the numbers to check
against one process. ``observe_pipeline`` runs the same executor (``run_schedule``) with the
stage observed (``stage_observers``: a timeline of its ops, the sleeps of its emulated
compute, the bytes saved for backward); ``measure_activation_memory`` adds the peak of all
tensor memory (``lu.memory.measure_peak``). ``run_torch_pipeline`` does the same for PyTorch's
``torch.distributed.pipelining`` schedules (``parallel.torch_pipeline``).
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from labutils.core.commcount import count_collectives
from labutils.core.launcher import launch
from labutils.core.memory import measure_peak
from labutils.core.rank import progress
from labutils.core.timeline import Timeline
from labutils.experiments.stage_observers import SavedBytes, action_spans, stage_spans, work_spans
from labutils.parallel.model_parallel import StageLayout, boundary_shapes, split_model
from labutils.parallel.pipeline import (
    pipeline_worker,
    run_schedule,
    stage_schedules,
    validate_config,
)
from labutils.parallel.torch_pipeline import (
    SCHEDULES as TORCH_SCHEDULES,
)
from labutils.parallel.torch_pipeline import (
    build_schedule,
    schedule_order,
    validate_schedules,
)


def _shapes(model_fn, x, world_size, schedule, n_microbatches, sizes):
    """Validate in the caller (a bad pipeline raises before any process starts); stage shapes."""
    model = model_fn()
    sizes = validate_config(len(model), world_size, x.shape[0], n_microbatches, schedule, sizes)
    return sizes, boundary_shapes(split_model(model, world_size, sizes),
                                  x[:x.shape[0] // n_microbatches])


def run_pipeline(model_fn, x, y, world_size=2, schedule="1f1b", n_microbatches=4, sizes=None,
                 steps=1, lr=0.05, timeout=120.0, warn_oversubscription=True):
    """Validate, then launch ``pipeline_worker`` (one stage per rank): per-rank result dicts.
    ``warn_oversubscription=False`` for a run that times nothing (see ``lu.launch``)."""
    sizes, shapes = _shapes(model_fn, x, world_size, schedule, n_microbatches, sizes)
    return launch(pipeline_worker, model_fn, x, y, shapes, schedule=schedule,
                  n_microbatches=n_microbatches, sizes=sizes, steps=steps, lr=lr,
                  world_size=world_size, timeout=timeout,
                  warn_oversubscription=warn_oversubscription)


def observed_step(rank, stage, ops, prev_ops, x_mbs, y_mbs, in_shape, count_saved=True):
    """One ``run_schedule`` step with the stage observed: (loss, memory, ops' spans, work spans).
    ``memory`` is the step's ``SavedBytes`` (None with ``count_saved=False``: timed rounds skip
    its Python work per saved tensor); the spans are labelled by micro-batch."""
    layout = StageLayout(rank, dist.get_world_size())
    forwards = [i for op, i in ops if op == "F"]
    tl, memory = Timeline(rank), SavedBytes(stage) if count_saved else None
    work_spans([stage], rank)                  # drop earlier sleeps (e.g. of boundary_shapes)
    with stage_spans(stage, tl, forwards), \
            (memory.per_forward(stage, forwards) if memory else contextlib.nullcontext()):
        loss = run_schedule(ops, stage, layout, x_mbs, y_mbs, in_shape, prev_ops)
    return loss, memory, tl.spans, work_spans([stage], rank)


def observed_pipeline_worker(rank, world_size, model_fn, x, y, shapes, schedule="1f1b",
                             n_microbatches=4, sizes=None, steps=1, lr=0.05):
    """``pipeline_worker``'s own loop with each step run by ``observed_step``. Returns its dict
    plus, of the last step, ``spans`` (one per op), ``work_spans`` (emulated work: "F", "B",
    "W"), ``peak_microbatches`` and ``peak_activation_bytes`` (saved for backward, most at once)."""
    last, done = {}, []

    def step_fn(ops, stage, layout, x_mbs, y_mbs, in_shape, prev_ops):
        done.append(1)
        progress(len(done), steps, "steps")    # rank 0 drives a panel's bar
        dist.barrier()                         # every rank starts the step together
        loss, last["memory"], last["spans"], last["work"] = observed_step(
            rank, stage, ops, prev_ops, x_mbs, y_mbs, in_shape)
        return loss

    result = pipeline_worker(rank, world_size, model_fn, x, y, shapes, schedule=schedule,
                             n_microbatches=n_microbatches, sizes=sizes, steps=steps, lr=lr,
                             step_fn=step_fn)
    return {**result, "spans": last["spans"], "work_spans": last["work"],
            "peak_microbatches": last["memory"].peak_microbatches,
            "peak_activation_bytes": last["memory"].peak_bytes}


def observe_pipeline(model_fn, x, y, world_size=2, schedule="1f1b", n_microbatches=4,
                     sizes=None, steps=1, lr=0.05, timeout=120.0, warn_oversubscription=True):
    """``run_pipeline`` with every stage observed (``observed_pipeline_worker``)."""
    sizes, shapes = _shapes(model_fn, x, world_size, schedule, n_microbatches, sizes)
    return launch(observed_pipeline_worker, model_fn, x, y, shapes, schedule=schedule,
                  n_microbatches=n_microbatches, sizes=sizes, steps=steps, lr=lr,
                  world_size=world_size, timeout=timeout,
                  warn_oversubscription=warn_oversubscription)


def _memory_worker(rank, world_size, model_fn, x, y, shapes, schedules, n_microbatches):
    out = {}
    for schedule in schedules:
        stage = split_model(model_fn(), world_size)[rank]
        ops, prev_ops = stage_schedules(schedule, rank, world_size, n_microbatches)
        args = (rank, stage, ops, prev_ops, x.chunk(n_microbatches), y.chunk(n_microbatches),
                shapes[rank])
        dist.barrier()
        (_, memory, _, _), peak = measure_peak(observed_step, *args)
        out[schedule] = {"peak_microbatches": memory.peak_microbatches,
                         "peak_activation_bytes": memory.peak_bytes, "peak_bytes": peak}
    return out


def measure_activation_memory(model_fn, x, y, world_size=4, schedules=("gpipe", "1f1b"),
                              n_microbatches=8, timeout=120.0):
    """One step of each schedule, per rank: {schedule: [dict per rank]} with
    ``peak_microbatches`` and ``peak_activation_bytes`` (``SavedBytes``, counted) and
    ``peak_bytes`` (every tensor byte live at the step's peak, ``lu.memory.measure_peak``)."""
    for schedule in schedules:
        _, shapes = _shapes(model_fn, x, world_size, schedule, n_microbatches, None)
    per_rank = launch(_memory_worker, model_fn, x, y, shapes, tuple(schedules), n_microbatches,
                      world_size=world_size, timeout=timeout, warn_oversubscription=False)
    return {s: [r[s] for r in per_rank] for s in schedules}


# ---- PyTorch's schedules ----------------------------------------------------------------------

# the step whose messages are counted (``count_collectives`` at the dispatcher): after step 0,
# whose first calls also exchange the stages' shapes; counting adds Python work to every
# message, so a timing leaves this step out
COUNTED_STEP = 1


def _pipeline_stages(pipe):
    """The ``PipelineStage`` objects a schedule drives (its attributes: one stage, or several)."""
    return list(pipe._stages) if hasattr(pipe, "_stages") else [pipe._stage]


def torch_pipeline_worker(rank, world_size, model_fn, x, y, schedules=("gpipe", "1f1b"),
                          n_microbatches=4, steps=1, lr=0.05):
    """PyTorch's ``PipelineStage`` and schedules on our stages, ``steps`` SGD steps each.

    Several schedules run in one launch, their steps interleaved (A B C A B C ...) so that
    machine noise hits all alike, each from a fresh model; importing
    ``torch.distributed.pipelining`` costs every new rank seconds. Returns {schedule: dict} with
    ``losses`` (on the rank holding the last stage), ``grads`` after the first step, ``params``
    after the last, the ``order`` of its actions on every rank, and per step the
    ``work_spans`` (emulated work), ``action_spans`` (each action of the schedule:
    ``stage_observers.action_spans``) and ``peak_saved_bytes`` (``SavedBytes``: activations held
    for backward, most at any one time on this rank), and with ``steps`` > ``COUNTED_STEP``
    the ``sends`` of that step: (peer, bytes) of every message this rank sent.
    """
    built = {s: build_schedule(s, rank, world_size, model_fn, n_microbatches) for s in schedules}
    optimizers = {s: torch.optim.SGD([p for m in mine for p in m.parameters()], lr=lr)
                  for s, (_, mine, _, _) in built.items()}
    out = {s: {"losses": [], "grads": None, "work_spans": [], "action_spans": [],
               "peak_saved_bytes": []}
           for s in schedules}
    for step in range(steps):
        progress(step + 1, steps, "steps")
        for schedule, (pipe, mine, has_first, has_last) in built.items():
            memory, mb_losses = SavedBytes(mine), []
            work_spans(mine, rank)              # drop earlier sleeps
            dist.barrier()                      # every rank starts the step together
            counting = count_collectives() if step == COUNTED_STEP else contextlib.nullcontext()
            actions = Timeline(rank)
            with memory.saving(), counting as counted, \
                    action_spans(_pipeline_stages(pipe), actions):
                pipe.step(x if has_first else None, target=y if has_last else None,
                          losses=mb_losses if has_last else None)
            res = out[schedule]
            if counted is not None:             # every message this rank sent in that step
                res["sends"] = [(c.peer, c.nbytes) for c in counted.sends]
            if has_last:
                res["losses"].append(float(sum(l.detach() for l in mb_losses)) / n_microbatches)
            if res["grads"] is None:
                res["grads"] = {n: p.grad.clone() for m in mine for n, p in m.named_parameters()}
            res["work_spans"].append(work_spans(mine, rank))
            res["action_spans"].append(sorted(actions.spans, key=lambda a: a.start))
            res["peak_saved_bytes"].append(memory.peak_bytes)
            optimizers[schedule].step()
            optimizers[schedule].zero_grad()
    for schedule, (pipe, mine, _, _) in built.items():
        out[schedule]["params"] = {n: p.detach().clone() for m in mine
                                   for n, p in m.named_parameters()}
        # GPipe and 1F1B run their own loop; their pipeline_order is a description (in torch
        # 2.13 it numbers rank 1's micro-batches of Schedule1F1B from 1), so keep only orders
        # that the schedule runs: those with several stages per rank
        multi = TORCH_SCHEDULES[schedule][1] > 1
        out[schedule]["order"] = schedule_order(pipe) if multi else None
    return out


def run_torch_pipeline(model_fn, x, y, world_size=2, schedules=("gpipe", "1f1b"),
                       n_microbatches=4, steps=1, lr=0.05, timeout=180.0,
                       warn_oversubscription=True):
    """Validate, then launch PyTorch's pipeline: {schedule: per-rank result dicts}."""
    validate_schedules(len(model_fn()), world_size, x.shape[0], n_microbatches, schedules)
    per_rank = launch(torch_pipeline_worker, model_fn, x, y, schedules=tuple(schedules),
                      n_microbatches=n_microbatches, steps=steps, lr=lr, world_size=world_size,
                      timeout=timeout, warn_oversubscription=warn_oversubscription)
    return {s: [r[s] for r in per_rank] for s in schedules}
