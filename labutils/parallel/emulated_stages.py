"""Emulated stage compute: layers that sleep, so a pipeline's schedule shows on a 2-core laptop.

Used by 06a1 and 06a2 (``pipeline``, ``torch_pipeline``, ``experiments.pipeline_bubble``) and 05 (through
``pipeline.make_pipeline_mlp``). Four ranks computing for real on two cores take turns on the
cores, so their timeline shows the operating system's scheduler, not the pipeline schedule. A
``Delay`` layer instead sleeps a set time per sample: a sleeping rank leaves the cores free, every
stage's work takes the time we chose on any machine, and the idle share that remains is the
schedule's (plus the messages). Values and gradients are those of the real layers; only the time
is emulated, and every result that uses it says so.

Zero-bubble schedules split a backward into the input gradient (B, on the critical path) and the
weight gradient (W, which can wait). ``Delay(..., weight_grad=True)`` emulates both: half of the
backward's sleep on the path to the input, half on a path to a parameter of its own.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from labutils.parallel.model_parallel import make_mlp

__all__ = ["Delay", "make_pipeline_mlp"]


def _work(log, name, seconds):
    """Sleep ``seconds``; note (name, start, end) in ``log``, which experiments read as spans."""
    start = time.perf_counter()
    time.sleep(seconds)
    log.append((name, start, time.perf_counter()))


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, forward_s, backward_s, log):
        ctx.backward_s, ctx.log = backward_s, log
        _work(log, "F", forward_s)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        _work(ctx.log, "B", ctx.backward_s)
        return grad, None, None, None


class _WeightGradSleep(torch.autograd.Function):
    """0 * weight, broadcast to ``like``'s shape: adds nothing, but its backward (the weight
    gradient, which is 0) takes ``seconds``, on a path that does not lead to the input."""

    @staticmethod
    def forward(ctx, weight, like, seconds, log):
        ctx.seconds, ctx.log = seconds, log
        return like.new_zeros(like.shape)

    @staticmethod
    def backward(ctx, grad):
        _work(ctx.log, "W", ctx.seconds)
        return torch.zeros(()), None, None, None


class Delay(nn.Module):
    """Identity that sleeps ``ms_per_sample`` per sample forward and twice that backward.

    With ``weight_grad``, the backward's sleep is split evenly between the input gradient and
    the gradient of a zero parameter ``emulated_weight`` (always 0, so values are unchanged).
    ``work_log`` lists every sleep as (kind "F", "B" or "W", start, end), for an experiment to
    read and clear.
    """

    def __init__(self, ms_per_sample, weight_grad=False):
        super().__init__()
        self.ms_per_sample = float(ms_per_sample)
        self.work_log = []
        if weight_grad:
            self.emulated_weight = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        if self.ms_per_sample <= 0:
            return x
        forward_s = self.ms_per_sample * x.shape[0] / 1e3
        if not hasattr(self, "emulated_weight"):
            return _Sleep.apply(x, forward_s, 2 * forward_s, self.work_log)
        return (_Sleep.apply(x, forward_s, forward_s, self.work_log)
                + _WeightGradSleep.apply(self.emulated_weight, x.detach(), forward_s,
                                         self.work_log))


def make_pipeline_mlp(n_layers=8, width=32, in_features=16, out_features=4, layer_ms=None,
                      seed=0, weight_grad=False):
    """make_mlp's blocks, each followed by a Delay of ``layer_ms[i]`` ms per sample."""
    model = make_mlp(n_layers, width, in_features, out_features, seed)
    if layer_ms is not None:
        if len(layer_ms) != n_layers:
            raise ValueError(f"layer_ms needs one cost per layer ({n_layers}); got {len(layer_ms)}")
        for block, ms in zip(model, layer_ms):
            block.append(Delay(ms, weight_grad))
    return model
