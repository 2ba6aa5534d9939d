"""Naive model parallelism: one sequential model cut into stages, one stage per rank.

Used by 05_model_parallel_principles; the splitting helpers and ``StageLayout`` are reused by
``labutils.parallel.microbatch`` (05) and ``labutils.parallel.pipeline`` (06a1). Activations
travel forward and gradients travel back with ``dist.send`` / ``dist.recv``; every result is
checked against one process running the whole model (``reference_step``). What a run measures
(its timeline, its messages, its memory) is attached from outside, in
``labutils.experiments.model_parallel_runs`` and ``labutils.experiments.stage_memory``.
"""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.distributed as dist
from torch import nn

from labutils.core.i18n import tr
from labutils.cost.parallel_dims import ParallelDims


def StageLayout(rank, world_size):
    """Where this rank sits in a chain of stages (rank r holds stage r): the place of ``rank``
    in a pipeline-only ``ParallelDims`` (06e composes it with the others), with ``rank``,
    ``world_size``, ``pp_is_first_stage``, ``pp_is_last_stage``, ``prev_rank``, ``next_rank``."""
    return ParallelDims(dp=1, tp=1, pp=world_size).coords(rank)


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


# ---- the lesson: forward sends activations, backward sends gradients ------------------------

def naive_forward(layout, stage, x, in_shape):
    """Receive this stage's input (or take the batch), run the stage, pass the output on."""
    if layout.pp_is_first_stage:
        stage_input = x
    else:
        stage_input = torch.empty(in_shape)
        dist.recv(stage_input, src=layout.prev_rank)
        stage_input.requires_grad_()          # we need d loss / d input to send it back
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
        stage_output.backward(grad_output)    # the vector-Jacobian product through this stage
    if rank > 0:
        dist.send(stage_input.grad, dst=rank - 1)


def naive_train_step(layout, stage, x, y, in_shape, backward_fn=naive_backward):
    """One training step's forward and backward on this stage: (output, loss or None)."""
    stage_input, stage_output = naive_forward(layout, stage, x, in_shape)
    loss = nn.functional.mse_loss(stage_output, y) if layout.pp_is_last_stage else None
    backward_fn(layout.rank, layout.world_size, stage_input, stage_output, loss)
    return stage_output.detach(), loss


def naive_model_parallel_worker(rank, world_size, model_fn, x, y, shapes, sizes=None,
                                steps=1, lr=0.05, backward_fn=naive_backward,
                                train_step=naive_train_step):
    """One stage per rank; ``steps`` SGD steps on the batch (x, y).

    Returns a dict: ``losses`` and ``output`` (last stage only), ``grads`` of the first step
    and ``params`` after the last, both by global parameter name. ``train_step``: a function
    with ``naive_train_step``'s signature (an observer wraps it; the loop stays this one).
    """
    layout = StageLayout(rank, world_size)
    stage = split_model(model_fn(), world_size, sizes)[rank]
    optimizer = torch.optim.SGD(stage.parameters(), lr=lr)
    losses, grads, output = [], None, None
    for _ in range(steps):
        out, loss = train_step(layout, stage, x, y, shapes[rank], backward_fn)
        if grads is None:
            grads = {n: p.grad.clone() for n, p in stage.named_parameters()}
            output = out if layout.pp_is_last_stage else None
        if loss is not None:
            losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad()                 # set to None: the next backward makes them anew
    params = {n: p.detach().clone() for n, p in stage.named_parameters()}
    return {"losses": losses, "output": output, "grads": grads, "params": params}


def reference_step(model_fn, x, y, steps=1, lr=0.05):
    """The same training on one process: what every parallel version must reproduce."""
    model = model_fn()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses, grads, output = [], None, None
    for _ in range(steps):
        out = model(x)
        loss = nn.functional.mse_loss(out, y)
        loss.backward()
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
            output = out.detach()
        losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"losses": losses, "output": output, "grads": grads, "params": params}


def merge_stage_results(results, key):
    """Union of the per-rank ``grads`` or ``params`` dicts: the whole model's, by name."""
    merged = {}
    for r in results:
        merged.update(r[key])
    return merged
