"""Observing a pipeline stage from outside (05, 06a1, 06a2): its forward and backward spans, the
bytes autograd saves for its backward, the sleeps of its emulated compute, and the actions that
PyTorch's pipelining schedules run (``action_spans``).

The executors in ``labutils.parallel`` (``model_parallel``, ``microbatch``, ``pipeline``,
``torch_pipeline``) carry no timer and no counter; an experiment attaches these to the stage
module they run, with module hooks and autograd hooks, so the code a student reads stays the
algorithm.

    tl = lu.timeline.Timeline(rank)
    with stage_spans(stage, tl, labels=[0, 1, 2, 3]):
        run_schedule(...)                      # tl.spans: "forward" / "backward" per call
"""
from __future__ import annotations

import contextlib
import itertools
import time
from collections import Counter

import torch

from labutils.core.timeline import Timeline
from labutils.parallel.emulated_stages import Delay

__all__ = ["SavedBytes", "action_spans", "stage_spans", "work_spans"]


@contextlib.contextmanager
def stage_spans(stage, tl, labels=None):
    """Record a "forward" span for every call of ``stage`` and a "backward" span for the
    backward pass through its output, into ``tl``; labelled by ``labels`` (one per call, e.g.
    the micro-batch indices of a schedule's forwards in order; none: no label).

    The forward span is the module call alone (waiting in ``recv`` before it is idle time).
    The backward span runs from autograd reaching the stage's output (so after the gradient
    arrived) to the end of that backward pass, before the executor sends the input's gradient
    on: a span covering the send could overlap the neighbour's, which starts on arrival.
    """
    names = iter(labels) if labels is not None else itertools.repeat("")
    started = {}

    def before(module, args):
        started[module] = (time.perf_counter(), next(names))

    def after(module, args, output):
        start, label = started.pop(module)
        tl.add("forward", start, time.perf_counter(), label)
        if output.grad_fn is None:          # a forward without autograd: no backward to time
            return

        def reached(grad_outputs):
            began = time.perf_counter()
            torch.autograd.Variable._execution_engine.queue_callback(    # at the pass's end
                lambda: tl.add("backward", began, time.perf_counter(), label))
        output.grad_fn.register_prehook(reached)

    handles = [stage.register_forward_pre_hook(before), stage.register_forward_hook(after)]
    try:
        yield tl
    finally:
        for h in handles:
            h.remove()


# PipelineStage's methods that run one action of a torch.distributed.pipelining schedule
_ACTIONS = {"forward_one_chunk": "F", "backward_one_chunk": "B",
            "backward_weight_one_chunk": "W"}


@contextlib.contextmanager
def action_spans(pipeline_stages, tl):
    """Record every action that PyTorch's schedule runs on ``pipeline_stages`` (its
    ``PipelineStage`` objects) into ``tl``: a span named "F", "B" (full backward), "I" (input
    gradient only) or "W" (weight gradient), labelled (stage index, micro-batch). A span is the
    stage's method call, so the schedule's waits for messages lie between spans."""
    def wrap(stage, method, kind):
        original = getattr(stage, method)

        def timed(chunk, *args, **kwargs):
            name = kind
            if kind == "B" and not kwargs.get("full_backward", args[1] if len(args) > 1 else True):
                name = "I"
            start = time.perf_counter()
            try:
                return original(chunk, *args, **kwargs)
            finally:
                tl.add(name, start, time.perf_counter(), (stage.stage_index, chunk))
        setattr(stage, method, timed)       # on the instance: the class stays untouched

    for stage in pipeline_stages:
        for method, kind in _ACTIONS.items():
            wrap(stage, method, kind)
    try:
        yield tl
    finally:
        for stage in pipeline_stages:
            for method in _ACTIONS:
                delattr(stage, method)      # the class's method shows through again


def work_spans(modules, rank):
    """The emulated work (``Delay``'s sleeps, "F", "B", "W") of ``modules`` since the last call,
    as spans of ``rank``, in time order; clears the logs it read."""
    tl = Timeline(rank)
    for module in modules:
        for delay in (m for m in module.modules() if isinstance(m, Delay)):
            for name, start, end in delay.work_log:
                tl.add(name, start, end)
            delay.work_log.clear()
    return sorted(tl.spans, key=lambda s: s.start)


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
    (``run_schedule``, PyTorch's schedules): wrap its work in ``saving(label)``, or in
    ``per_forward(stage, labels)`` to label what each forward of ``stage`` saves."""

    def __init__(self, stage_modules):
        modules = stage_modules if isinstance(stage_modules, (list, tuple)) else [stage_modules]
        self.params = {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}
        self.live, self.by_label = {}, Counter()   # region -> [bytes, holders]; label -> holders
        self.bytes = self.peak_bytes = self.peak_microbatches = 0
        self.label = None

    @contextlib.contextmanager
    def saving(self, label=None):
        previous, self.label = self.label, label
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield self
        finally:
            self.label = previous

    @contextlib.contextmanager
    def per_forward(self, stage, labels):
        """Count inside the block; what is saved from a call of ``stage`` on (its loss too)
        belongs to the next of ``labels``."""
        labels = iter(labels)

        def before(module, args):
            self.label = next(labels)
        handle = stage.register_forward_pre_hook(before)
        try:
            with self.saving():
                yield self
        finally:
            handle.remove()

    def _pack(self, t):
        if t.untyped_storage().data_ptr() in self.params:
            return t
        key, label = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel()), self.label
        entry = self.live.setdefault(key, [t.numel() * t.element_size(), 0])
        self.bytes += entry[0] if entry[1] == 0 else 0
        entry[1] += 1
        self.by_label[label] += 1
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        self.peak_microbatches = max(self.peak_microbatches, len(self.by_label))
        return _Saved(t, lambda: self._release(key, label))

    @staticmethod
    def _unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved

    def _release(self, key, label):
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.bytes -= entry[0]
            del self.live[key]
        self.by_label[label] -= 1
        if self.by_label[label] == 0:
            del self.by_label[label]
