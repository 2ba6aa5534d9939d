"""Pipeline parallelism from send/recv: GPipe and 1F1B over a list of stages.

Used by 06a1_pipeline_from_scratch and 06a2_pipeline_schedules (and, for the idea of
micro-batches, 05_model_parallel_principles).
A schedule is a plain list of ("F", i) / ("B", i) operations per stage; one executor runs any
schedule with blocking ``recv`` and non-blocking ``isend``, so a schedule whose dependencies are
acyclic cannot deadlock. Gradients are accumulated over the micro-batches and checked against
one process training on the whole batch. PyTorch's own ``torch.distributed.pipelining`` on the
same stages is ``torch_pipeline``; layers whose compute is emulated (they sleep) are
``emulated_stages``. Nothing here observes itself: launching, timelines and activation memory
attach from outside in ``experiments.pipeline_runs``; the measured bubble is
``experiments.pipeline_bubble``, the checker ``exercises.lab06a1`` and the benchmark
``bench.pipeline``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from labutils.core.i18n import tr
from labutils.cost.step_time import bubble_fraction as predicted_bubble  # (p-1)/(m+p-1)
from labutils.parallel.emulated_stages import Delay, make_pipeline_mlp
from labutils.parallel.model_parallel import (
    StageLayout,
    reference_step,
    split_model,
    validate_sizes,
)

__all__ = [
    "SCHEDULES",
    "Delay",
    "gpipe_schedule",
    "make_pipeline_mlp",
    "one_f_one_b_schedule",
    "pipeline_worker",
    "predicted_bubble",
    "reference_train",
    "run_schedule",
    "validate_config",
]


# ---- schedules: the order of work on one stage ---------------------------------------------

def gpipe_schedule(stage, n_stages, n_microbatches):
    """GPipe: every forward, then every backward (Huang et al. 2019)."""
    return ([("F", i) for i in range(n_microbatches)]
            + [("B", i) for i in range(n_microbatches)])


def one_f_one_b_schedule(stage, n_stages, n_microbatches):
    """1F1B (PipeDream-Flush, Narayanan et al. 2021): warm up, alternate, cool down.

    Stage s warms up with p - s - 1 forwards; the steady state's first forward makes p - s
    before its first backward, and it never holds more than p - s micro-batches'
    activations (GPipe holds all m).
    """
    warmup = min(n_stages - stage - 1, n_microbatches)
    ops = [("F", i) for i in range(warmup)]
    for i in range(n_microbatches - warmup):       # steady state: one forward, one backward
        ops += [("F", warmup + i), ("B", i)]
    ops += [("B", i) for i in range(n_microbatches - warmup, n_microbatches)]
    return ops


SCHEDULES = {"gpipe": gpipe_schedule, "1f1b": one_f_one_b_schedule}


# ---- the executor ---------------------------------------------------------------------------

def validate_config(n_layers, n_stages, batch_size, n_microbatches, schedule="1f1b", sizes=None):
    """Refuse a bad pipeline before any process starts, saying what to change."""
    if schedule not in SCHEDULES and not callable(schedule):
        raise ValueError(tr("unknown schedule {schedule!r}; use one of {names} or a function "
                            "(stage, n_stages, n_microbatches) -> ops",
                            schedule=schedule, names=", ".join(SCHEDULES)))
    if n_microbatches < 1:
        raise ValueError(tr("n_microbatches must be >= 1; got {n}", n=n_microbatches))
    if batch_size % n_microbatches:
        options = [d for d in range(1, batch_size + 1) if batch_size % d == 0]
        raise ValueError(tr("a batch of {batch_size} samples cannot be split into {m} equal "
                            "micro-batches: use n_microbatches in {options} or a batch size "
                            "divisible by {m}", batch_size=batch_size, m=n_microbatches,
                            options=options))
    return validate_sizes(sizes, n_layers, n_stages)   # also: more stages than layers


def received_before(prev_ops):
    """{j: micro-batches whose gradient the previous stage has received before it runs F(j)}.

    A gloo ``isend`` keeps its tensor until ``wait()``; ``is_completed()`` stays False until
    then. Once activation j arrives from the previous stage, every gradient it took before F(j)
    has surely arrived, so waiting on those sends returns at once and frees their memory.
    """
    done, release = set(), {}
    for op, i in prev_ops:
        if op == "B":
            done.add(i)
        else:
            release[i] = set(done)
    return release


def run_schedule(ops, stage, layout, x_mbs, y_mbs, in_shape, prev_ops=None,
                 loss_fn=nn.functional.mse_loss):
    """Run one stage's ops; gradients accumulate in ``stage``'s .grad over the micro-batches.
    Returns the sum of micro-batch losses on the last stage (0 elsewhere).

    Tags are micro-batch indices, so a message can only meet the recv it was meant for.
    ``prev_ops`` (the previous stage's schedule) lets sent gradients be freed early (see
    ``received_before``).
    """
    m = len(x_mbs)
    release = received_before(prev_ops) if prev_ops is not None else {}
    inputs, outputs = {}, {}                # kept from F(i) until B(i): the activations
    sent_forward, sent_backward = {}, {}    # isend handles by micro-batch
    total_loss = 0.0
    for op, i in ops:
        if op == "F":
            if layout.pp_is_first_stage:
                stage_input = x_mbs[i]
            else:
                stage_input = torch.empty(in_shape)
                dist.recv(stage_input, src=layout.prev_rank, tag=i)
                stage_input.requires_grad_()      # its gradient is what B(i) sends back
                for j in release.get(i, ()) & sent_backward.keys():
                    sent_backward.pop(j).wait()
            out = stage(stage_input)
            if layout.pp_is_last_stage:           # mean over the batch = sum of means / m
                out = loss_fn(out, y_mbs[i]) / m
                total_loss += out.item()
            else:
                sent_forward[i] = dist.isend(out.detach(), dst=layout.next_rank, tag=i)
            inputs[i], outputs[i] = stage_input, out
        elif op == "B":
            stage_input, out = inputs.pop(i), outputs.pop(i)
            if layout.pp_is_last_stage:
                out.backward()
            else:
                grad_output = torch.empty_like(out)
                dist.recv(grad_output, src=layout.next_rank, tag=i)
                sent_forward.pop(i).wait()        # its gradient came back: it has arrived
                out.backward(grad_output)
            if not layout.pp_is_first_stage:
                sent_backward[i] = dist.isend(stage_input.grad, dst=layout.prev_rank, tag=i)
            del stage_input, out                  # the graph of micro-batch i can go now
        else:
            raise ValueError(f"unknown op {op!r} in schedule; use 'F' or 'B'")
    for work in [*sent_forward.values(), *sent_backward.values()]:
        work.wait()                       # the tensors must stay alive until they are sent
    return total_loss


def stage_schedules(schedule, rank, world_size, n_microbatches):
    """This stage's ops and the previous stage's (None on the first stage)."""
    schedule_fn = SCHEDULES[schedule] if isinstance(schedule, str) else schedule
    prev_ops = schedule_fn(rank - 1, world_size, n_microbatches) if rank > 0 else None
    return schedule_fn(rank, world_size, n_microbatches), prev_ops


def pipeline_worker(rank, world_size, model_fn, x, y, shapes, schedule="1f1b", n_microbatches=4,
                    sizes=None, steps=1, lr=0.05, step_fn=run_schedule):
    """Train ``steps`` SGD steps with a pipeline schedule.

    Returns a dict: ``losses`` (last stage), ``grads`` after the first step and ``params`` after
    the last (by global name). ``step_fn``: a function with ``run_schedule``'s signature (an
    observer wraps it; the loop stays this one).
    """
    layout = StageLayout(rank, world_size)
    stage = split_model(model_fn(), world_size, sizes)[rank]
    optimizer = torch.optim.SGD(stage.parameters(), lr=lr)
    ops, prev_ops = stage_schedules(schedule, rank, world_size, n_microbatches)
    x_mbs, y_mbs = x.chunk(n_microbatches), y.chunk(n_microbatches)
    losses, grads = [], None
    for _ in range(steps):
        losses.append(step_fn(ops, stage, layout, x_mbs, y_mbs, shapes[rank], prev_ops))
        if grads is None:
            grads = {n: p.grad.clone() for n, p in stage.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
    return {"losses": losses if layout.pp_is_last_stage else [], "grads": grads,
            "params": {n: p.detach().clone() for n, p in stage.named_parameters()}}


def reference_train(model_fn, x, y, steps=1, lr=0.05):
    """One process, the whole batch at once: the numbers every pipeline must reproduce."""
    return reference_step(model_fn, x, y, steps=steps, lr=lr)


# ---- the exercise's rules: what makes a list of ops a schedule -----------------------------

def schedule_problem(ops, n_microbatches):
    """None if every micro-batch has one F then one B; else what is wrong, in words."""
    ops = [tuple(o) for o in ops]
    for i in range(n_microbatches):
        for op in "FB":
            if ops.count((op, i)) != 1:
                return tr("{op}{i} appears {n} times", op=op, i=i, n=ops.count((op, i)))
        if ops.index(("B", i)) < ops.index(("F", i)):
            return tr("B{i} before F{i}", i=i)
    if len(ops) != 2 * n_microbatches:
        return tr("{n} ops, expected {e}", n=len(ops), e=2 * n_microbatches)
    return None
