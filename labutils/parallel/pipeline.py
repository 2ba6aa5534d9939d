"""Pipeline parallelism from send/recv: GPipe and 1F1B over a list of stages.

Used by 06a_pipeline_parallel (and, for the idea of micro-batches, 05_model_parallel_principles).
A schedule is a plain list of ("F", i) / ("B", i) operations per stage; one executor runs any
schedule with blocking ``recv`` and non-blocking ``isend``, so a schedule whose dependencies are
acyclic cannot deadlock. Gradients are accumulated over the micro-batches and checked against
one process training on the whole batch. PyTorch's own ``torch.distributed.pipelining`` on the
same stages is ``torch_pipeline``; layers whose compute is emulated (they sleep) are
``emulated_stages``; the measured bubble is ``experiments.pipeline_bubble``, the
checker ``exercises.lab06a`` and the benchmark ``bench.pipeline``.
"""
from __future__ import annotations

import contextlib
from collections import Counter

import torch
import torch.distributed as dist
from torch import nn

from labutils.core.i18n import tr
from labutils.core.launcher import launch
from labutils.core.memory import measure_peak
from labutils.core.rank import progress
from labutils.core.timeline import Timeline
from labutils.cost.step_time import bubble_fraction as predicted_bubble  # (p-1)/(m+p-1)
from labutils.parallel.emulated_stages import Delay, make_pipeline_mlp, recording
from labutils.parallel.model_parallel import (
    StageLayout,
    backward_from,
    boundary_shapes,
    reference_step,
    sgd_step,
    split_model,
    validate_sizes,
)

__all__ = [
    "SCHEDULES",
    "Delay",
    "SavedBytes",
    "gpipe_schedule",
    "make_pipeline_mlp",
    "one_f_one_b_schedule",
    "pipeline_worker",
    "predicted_bubble",
    "reference_train",
    "run_pipeline",
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


class _Saved:
    """What autograd keeps for one saved tensor while counted: freed with the graph."""
    __slots__ = ("_release", "tensor")

    def __init__(self, tensor, release):
        self.tensor, self._release = tensor, release

    def __del__(self):
        self._release()


class SavedBytes:
    """Bytes autograd holds saved for backward on this rank, counted as they are saved and as
    the graph frees them: the peak over a step (the pipeline's activation memory) and the most
    micro-batches whose tensors were held at once. Each tensor region once, weights aside; a
    micro-batch that is a view of the whole batch counts its own bytes. Works for any executor
    (``run_schedule``, PyTorch's schedules): wrap its work in ``saving(label)``."""

    def __init__(self, stage_modules):
        modules = stage_modules if isinstance(stage_modules, (list, tuple)) else [stage_modules]
        self.params = {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}
        self.live, self.by_label = {}, Counter()   # region -> [bytes, holders]; label -> holders
        self.bytes = self.peak_bytes = self.peak_microbatches = 0

    @contextlib.contextmanager
    def saving(self, label=None):
        def pack(t):
            if t.untyped_storage().data_ptr() in self.params:
                return t
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
            entry = self.live.setdefault(key, [t.numel() * t.element_size(), 0])
            self.bytes += entry[0] if entry[1] == 0 else 0
            entry[1] += 1
            self.by_label[label] += 1
            self.peak_bytes = max(self.peak_bytes, self.bytes)
            self.peak_microbatches = max(self.peak_microbatches, len(self.by_label))
            return _Saved(t, lambda: self._release(key, label))

        def unpack(saved):
            return saved.tensor if isinstance(saved, _Saved) else saved

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield self

    def _release(self, key, label):
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.bytes -= entry[0]
            del self.live[key]
        self.by_label[label] -= 1
        if self.by_label[label] == 0:
            del self.by_label[label]


def run_schedule(ops, stage, layout, x_mbs, y_mbs, in_shape, tl, prev_ops=None,
                 loss_fn=nn.functional.mse_loss, memory=None):
    """Run one stage's ops; gradients accumulate in ``stage``'s .grad over the micro-batches.
    Returns the sum of micro-batch losses on the last stage (0 elsewhere).

    Tags are micro-batch indices, so a message can only meet the recv it was meant for.
    ``prev_ops`` (the previous stage's schedule) lets sent gradients be freed early (see
    ``received_before``). ``memory``: a ``SavedBytes`` that counts activation memory.
    """
    m = len(x_mbs)
    release = received_before(prev_ops) if prev_ops is not None else {}
    inputs, outputs = {}, {}
    sent_forward, sent_backward = {}, {}    # isend handles by micro-batch
    total_loss = 0.0
    for op, i in ops:
        if op == "F":
            if layout.pp_is_first_stage:
                stage_input = x_mbs[i]
            else:
                stage_input = torch.empty(in_shape)
                dist.recv(stage_input, src=layout.prev_rank, tag=i)
                stage_input.requires_grad_()
                for j in release.get(i, ()) & sent_backward.keys():
                    sent_backward.pop(j).wait()
            with tl.span("forward", label=i), \
                    (memory.saving(i) if memory else contextlib.nullcontext()):
                out = stage(stage_input)
                if layout.pp_is_last_stage:   # mean over the batch = sum of means / m
                    out = loss_fn(out, y_mbs[i]) / m
            if layout.pp_is_last_stage:
                total_loss += out.item()
            else:
                sent_forward[i] = dist.isend(out.detach(), dst=layout.next_rank, tag=i)
            inputs[i], outputs[i] = stage_input, out
        elif op == "B":
            stage_input, out = inputs.pop(i), outputs.pop(i)
            if not layout.pp_is_last_stage:
                grad_output = torch.empty_like(out)
                dist.recv(grad_output, src=layout.next_rank, tag=i)
                sent_forward.pop(i).wait()    # its gradient came back: it has arrived
            with tl.span("backward", label=i):
                if layout.pp_is_last_stage:
                    out.backward()
                else:
                    backward_from(out, grad_output)
            if not layout.pp_is_first_stage:
                sent_backward[i] = dist.isend(stage_input.grad, dst=layout.prev_rank, tag=i)
            del stage_input, out          # the graph of micro-batch i can go now
        else:
            raise ValueError(f"unknown op {op!r} in schedule; use 'F' or 'B'")
    for work in [*sent_forward.values(), *sent_backward.values()]:
        work.wait()                       # the tensors must stay alive until they are sent
    return total_loss


def pipeline_worker(rank, world_size, model_fn, x, y, shapes, schedule="1f1b", n_microbatches=4,
                    sizes=None, steps=1, lr=0.05, measure_memory=False):
    """Train ``steps`` SGD steps with a pipeline schedule; the last step is timed.

    Returns a dict: ``losses`` (last stage), ``grads`` after the first step and ``params`` after
    the last (by global name), ``spans`` of the last step (one per op, labelled by micro-batch),
    its ``work_spans`` (the emulated work of ``Delay`` layers: "F", "B", "W"),
    ``peak_microbatches`` and ``peak_activation_bytes`` (saved for backward, most at any one time
    on this rank), and with ``measure_memory`` the last step's measured ``peak_bytes``
    (``lu.memory.measure_peak``).
    """
    layout = StageLayout(rank, world_size)
    stage = split_model(model_fn(), world_size, sizes)[rank]
    schedule_fn = SCHEDULES[schedule] if isinstance(schedule, str) else schedule
    ops = schedule_fn(rank, world_size, n_microbatches)
    prev_ops = None if layout.pp_is_first_stage else schedule_fn(rank - 1, world_size,
                                                                 n_microbatches)
    x_mbs, y_mbs = x.chunk(n_microbatches), y.chunk(n_microbatches)
    in_shape = shapes[rank]
    losses, grads, measured = [], None, None
    for step in range(steps):
        progress(step + 1, steps, "steps")  # rank 0 drives a panel's bar
        tl = Timeline(rank)
        dist.barrier()                 # every rank starts the step together
        memory = SavedBytes(stage)
        args = (ops, stage, layout, x_mbs, y_mbs, in_shape, tl, prev_ops)
        with recording(Timeline(rank)) as work:
            if measure_memory and step == steps - 1:
                loss, measured = measure_peak(run_schedule, *args, memory=memory)
            else:
                loss = run_schedule(*args, memory=memory)
        peak_held, peak_bytes = memory.peak_microbatches, memory.peak_bytes
        if grads is None:
            grads = {n: p.grad.clone() for n, p in stage.named_parameters()}
        losses.append(loss)
        sgd_step(stage, lr)
    return {"losses": losses if layout.pp_is_last_stage else [], "grads": grads,
            "params": {n: p.detach().clone() for n, p in stage.named_parameters()},
            "spans": tl.spans, "work_spans": work.spans, "peak_microbatches": peak_held,
            "peak_activation_bytes": peak_bytes, "peak_bytes": measured}


def run_pipeline(model_fn, x, y, world_size=2, schedule="1f1b", n_microbatches=4, sizes=None,
                 steps=1, lr=0.05, measure_memory=False, timeout=120.0,
                 warn_oversubscription=True):
    """Validate, then launch one stage per rank; returns the per-rank result dicts.
    ``warn_oversubscription=False`` for a run that times nothing (see ``lu.launch``)."""
    model = model_fn()
    sizes = validate_config(len(model), world_size, x.shape[0], n_microbatches, schedule, sizes)
    shapes = boundary_shapes(split_model(model, world_size, sizes), x[:x.shape[0] // n_microbatches])
    return launch(pipeline_worker, model_fn, x, y, shapes, schedule=schedule,
                  n_microbatches=n_microbatches, sizes=sizes, steps=steps, lr=lr,
                  measure_memory=measure_memory, world_size=world_size, timeout=timeout,
                  warn_oversubscription=warn_oversubscription)


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
