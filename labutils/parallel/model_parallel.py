"""Naive model parallelism: one sequential model cut into stages, one stage per rank.

Used by 05_model_parallel_principles; the splitting helpers and ``StageLayout`` are reused by
``labutils.parallel.microbatch`` (05) and ``labutils.parallel.pipeline`` (06a). Activations
travel forward and gradients travel back with ``dist.send`` / ``dist.recv``; every result is
checked against one process running the whole model (``reference_step``).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from labutils.core.commcount import count_collectives
from labutils.core.i18n import tr
from labutils.core.launcher import launch
from labutils.core.memory import measure_peak
from labutils.core.timeline import Timeline


@dataclass(frozen=True)
class StageLayout:
    """Where this rank sits in a chain of stages (rank r holds stage r)."""
    rank: int
    world_size: int

    @property
    def pp_is_first_stage(self):
        return self.rank == 0

    @property
    def pp_is_last_stage(self):
        return self.rank == self.world_size - 1

    @property
    def prev_rank(self):
        return None if self.pp_is_first_stage else self.rank - 1

    @property
    def next_rank(self):
        return None if self.pp_is_last_stage else self.rank + 1


# ---- the model and how it is cut ----------------------------------------------------------

def make_mlp(n_layers=8, width=64, in_features=16, out_features=4, seed=0):
    """A deep MLP as nn.Sequential of ``n_layers`` blocks (Linear + Tanh; the last is Linear).

    Each block is one "layer" a stage boundary may fall between. Same seed, same weights, in
    every process, so each rank can build the whole model and keep only its own stage.
    """
    torch.manual_seed(seed)
    dims = [in_features] + [width] * (n_layers - 1) + [out_features]
    blocks = [nn.Sequential(nn.Linear(dims[i], dims[i + 1]), nn.Tanh())
              for i in range(n_layers - 1)]
    blocks.append(nn.Sequential(nn.Linear(dims[-2], dims[-1])))
    return nn.Sequential(*blocks)


def split_sizes(n_layers, n_stages):
    """Layers per stage for an even split, e.g. 8 layers on 3 stages -> [3, 3, 2]."""
    if n_stages < 1:
        raise ValueError(f"need at least one stage; got n_stages={n_stages}")
    if n_stages > n_layers:
        raise ValueError(tr("cannot split a model of {n_layers} layers into {n_stages} stages: "
                            "use at most {n_layers} stages (world_size <= {n_layers}) or a "
                            "deeper model", n_layers=n_layers, n_stages=n_stages))
    base, extra = divmod(n_layers, n_stages)
    return [base + (1 if s < extra else 0) for s in range(n_stages)]


def validate_sizes(sizes, n_layers, n_stages):
    """Validate a custom split (layers per stage); return it as a list."""
    if sizes is None:
        return split_sizes(n_layers, n_stages)
    sizes = list(sizes)
    if len(sizes) != n_stages:
        raise ValueError(f"sizes={sizes} gives {len(sizes)} stages but there are {n_stages} "
                         f"ranks: give one layer count per rank")
    if any(s < 1 for s in sizes) or sum(sizes) != n_layers:
        raise ValueError(f"sizes={sizes} must be positive layer counts summing to the model's "
                         f"{n_layers} layers")
    return sizes


def balanced_sizes(costs, n_stages):
    """Layers per stage minimising the slowest stage's cost (contiguous split, exact DP).

    ``costs``: the measured (or estimated) time of each layer. A pipeline runs at the pace of
    its slowest stage, so balance cost, not layer count.
    """
    n = len(costs)
    split_sizes(n, n_stages)                       # same errors as an even split
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    inf = float("inf")
    # best[k][j]: smallest max-stage cost putting the first j layers on k stages
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, n_stages + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], prefix[j] - prefix[i])
                if value < best[k][j]:
                    best[k][j], cut[k][j] = value, i
    sizes, j = [], n
    for k in range(n_stages, 0, -1):
        sizes.append(j - cut[k][j])
        j = cut[k][j]
    return sizes[::-1]


def stage_costs(costs, sizes):
    """Total cost of each stage for a split (layers per stage)."""
    out, start = [], 0
    for size in sizes:
        out.append(sum(costs[start:start + size]))
        start += size
    return out


def split_model(model, n_stages, sizes=None):
    """Cut an nn.Sequential into ``n_stages`` consecutive stages.

    Stages keep the layers' original indices as names ("3.0.weight"), so a stage's gradients
    can be compared by name with the whole model's.
    """
    sizes = validate_sizes(sizes, len(model), n_stages)
    stages, start = [], 0
    for size in sizes:
        stages.append(nn.Sequential(OrderedDict(
            (str(i), model[i]) for i in range(start, start + size))))
        start += size
    return stages


def boundary_shapes(stages, x):
    """Shape of each stage's input for a batch ``x`` (ranks need it to post a recv)."""
    shapes = []
    with torch.no_grad():
        for stage in stages:
            shapes.append(tuple(x.shape))
            x = stage(x)
    return shapes


def sgd_step(module, lr):
    """Plain SGD, written out: ``torch.optim`` would import torch._dynamo in every rank (seconds)."""
    with torch.no_grad():
        for p in module.parameters():
            p -= lr * p.grad
            p.grad = None


def backward_from(output, grad_output):
    """``output.backward(grad_output)``: the vector-Jacobian product through this stage.

    Written as the gradient of the scalar sum(output * grad_output), which gives bit-identical
    gradients (d/d output is grad_output times 1.0); a non-scalar ``.backward(grad)`` imports
    sympy on first use, which costs several seconds in every freshly forked rank.
    """
    (output * grad_output).sum().backward()


# ---- the lesson: forward sends activations, backward sends gradients ------------------------

def naive_forward(layout, stage, x, in_shape, tl):
    """Receive this stage's input (or take the batch), run the stage, pass the output on."""
    if layout.pp_is_first_stage:
        stage_input = x
    else:
        stage_input = torch.empty(in_shape)
        dist.recv(stage_input, src=layout.prev_rank)
        stage_input.requires_grad_()          # we need d loss / d input to send it back
    with tl.span("forward"):                  # compute only: waiting in recv is idle time
        stage_output = stage(stage_input)
    if not layout.pp_is_last_stage:
        dist.send(stage_output.detach(), dst=layout.next_rank)
    return stage_input, stage_output


def naive_backward(rank, world_size, stage_input, stage_output, loss):
    """Backward through this stage; send d loss / d input to the previous stage."""
    if rank == world_size - 1:
        loss.backward()                       # the last stage starts the backward pass
    else:
        grad_output = torch.empty_like(stage_output)
        dist.recv(grad_output, src=rank + 1)  # d loss / d (our output), from the next stage
        backward_from(stage_output, grad_output)  # = stage_output.backward(grad_output)
    if rank > 0:
        dist.send(stage_input.grad, dst=rank - 1)


def naive_model_parallel_worker(rank, world_size, model_fn, x, y, shapes, sizes=None,
                                steps=1, lr=0.05, backward_fn=naive_backward,
                                measure_memory=False, count_messages=False):
    """One stage per rank; ``steps`` SGD steps on the batch (x, y); a timeline of the work.

    Returns a dict: ``losses`` and ``output`` (last stage only), ``grads`` of the first step
    and ``params`` after the last, both by global parameter name, the ``spans``, and with
    ``measure_memory`` this rank's ``peak_bytes``: its weights plus the measured peak of one
    training step (``lu.memory.measure_peak``). ``step_spans``: the spans of each step.
    ``count_messages``: ``messages``, the send/recv calls of the first step, by c10d op name.
    """
    layout = StageLayout(rank, world_size)
    stage = split_model(model_fn(), world_size, sizes)[rank]
    tl = Timeline(rank)
    losses, grads, output = [], None, None

    def train_step():
        stage_input, stage_output = naive_forward(layout, stage, x, shapes[rank], tl)
        loss = nn.functional.mse_loss(stage_output, y) if layout.pp_is_last_stage else None
        # The backward span runs from autograd reaching this stage's output (after the recv in
        # backward_fn: waiting shows as idle) to the end of that pass, before backward_fn sends
        # (a span covering the send could overlap the previous stage's, which starts on arrival)
        began, ended = [time.perf_counter()], []

        def reached(grads):
            began.append(time.perf_counter())
            torch.autograd.Variable._execution_engine.queue_callback(    # at the pass's end
                lambda: ended.append(time.perf_counter()))
        stage_output.grad_fn.register_prehook(reached)
        backward_fn(rank, world_size, stage_input, stage_output, loss)
        tl.add("backward", began[-1], ended[-1] if ended else time.perf_counter())
        return stage_output.detach(), (loss.item() if loss is not None else None)

    dist.barrier()                            # start the clocks together
    peak, bounds = None, []
    for step in range(steps):
        first = len(tl.spans)
        if measure_memory and step == 0:
            (out, loss), peak = measure_peak(train_step)   # forward + backward
            peak += weight_bytes(stage)
        elif count_messages and step == 0:
            with count_collectives() as counted:
                out, loss = train_step()
        else:
            out, loss = train_step()
        if grads is None:
            grads = {n: p.grad.clone() for n, p in stage.named_parameters()}
            output = out if layout.pp_is_last_stage else None
        if layout.pp_is_last_stage:
            losses.append(loss)
        sgd_step(stage, lr)
        bounds.append((first, len(tl.spans)))
    params = {n: p.detach().clone() for n, p in stage.named_parameters()}
    return {"losses": losses, "output": output, "grads": grads, "params": params,
            "spans": tl.spans, "step_spans": [tl.spans[a:b] for a, b in bounds],
            "peak_bytes": peak, "messages": dict(counted.by_op) if count_messages else None}


def weight_bytes(module):
    return sum(p.numel() * p.element_size() for p in module.parameters())


def single_process_peak(model_fn, x, y):
    """Weights plus the measured peak of forward + backward of the whole model, one process."""
    model = model_fn()
    _, peak = measure_peak(lambda: nn.functional.mse_loss(model(x), y).backward())
    return weight_bytes(model) + peak


def reference_step(model_fn, x, y, steps=1, lr=0.05):
    """The same training on one process: what every parallel version must reproduce."""
    model = model_fn()
    losses, grads, output = [], None, None
    for _ in range(steps):
        out = model(x)
        loss = nn.functional.mse_loss(out, y)
        loss.backward()
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
            output = out.detach()
        losses.append(loss.item())
        sgd_step(model, lr)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"losses": losses, "output": output, "grads": grads, "params": params}


def run_naive_model_parallel(model_fn, x, y, world_size=2, sizes=None, steps=1, lr=0.05,
                             backward_fn=naive_backward, measure_memory=False, timeout=60.0,
                             warn_oversubscription=True, count_messages=False):
    """Check the split, then launch one stage per rank; returns the per-rank result dicts.
    ``warn_oversubscription=False`` for runs that time nothing (see ``lu.launch``)."""
    model = model_fn()
    stages = split_model(model, world_size, sizes)   # raises before any process starts
    shapes = boundary_shapes(stages, x)
    return launch(naive_model_parallel_worker, model_fn, x, y, shapes, sizes=sizes, steps=steps,
                  lr=lr, backward_fn=backward_fn, measure_memory=measure_memory,
                  count_messages=count_messages, world_size=world_size, timeout=timeout,
                  warn_oversubscription=warn_oversubscription)


def merge_stage_results(results, key):
    """Union of the per-rank ``grads`` or ``params`` dicts: the whole model's, by name."""
    merged = {}
    for r in results:
        merged.update(r[key])
    return merged
