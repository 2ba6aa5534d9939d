"""ZeRO stages 1, 2 and 3 from scratch on reduce-scatter and all-gather (Rajbhandari et al.,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020).

Used by ``06c1_zero_stages`` (and its FSDP2 by ``06c2_fsdp_and_memory``). Each of the ``world_size`` data-parallel ranks owns one
equal slice (a *shard*) of every parameter, flattened and padded to a multiple of world_size:

* stage 1 (P_os): every rank keeps full weights and full gradients; after backward the
  gradients are reduce-scattered, each rank runs Adam on its shard only (1/N of the optimiser
  state), and the updated shards are all-gathered back into the full weights.
* stage 2 (P_os+g): the same, but each gradient is reduce-scattered the moment backward has
  produced it (a post-accumulate-grad hook) and the full gradient is freed at once.
* stage 3 (P_os+g+p): only shards of the weights exist; a layer all-gathers its weight just
  before it is used, forward and again backward, and drops it right after.

The general versions live beside this lesson module, tested against PyTorch's own:
``zero_optimizer.ZeroOptimizer`` (stages 1-2 as a ``torch.optim.Optimizer`` around any optimizer
class; ``Zero12`` here is a view of it) and ``zero3.Zero3Module`` (stage 3 for any module, on
module hooks; ``Zero3`` here is the lesson-sized version: one ``autograd.Function`` per Linear).

gloo on CPU runs ``reduce_scatter_single`` and ``all_gather_single`` (torch 2.13's names for
``reduce_scatter_tensor`` / ``all_gather_into_tensor``), checked by ``tests/test_sharding.py``.
Nothing here counts or measures: ``experiments/zero_training.py`` observes the collectives
(``core.commcount.count_collectives``) and the memory (``core.memory.LiveBytes``) from outside.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from labutils.parallel import zero_optimizer
from labutils.parallel.zero_optimizer import ZeroOptimizer, flat_padded, padded  # noqa: F401


@dataclass(frozen=True)
class ShardLayout:
    """This rank's place among the data-parallel ranks that share the model states."""
    rank: int
    world_size: int
    group: object = None


def reduce_scatter_mean(full_flat, layout):
    """(padded numel,) summed over ranks -> this rank's shard, divided by world size."""
    return zero_optimizer.reduce_scatter_mean(full_flat, layout.group)


def all_gather_flat(shard, layout):
    """This rank's shard -> the full (padded numel,) tensor, rank order."""
    full = shard.new_empty(shard.numel() * layout.world_size)
    zero_optimizer.all_gather_into(full, shard, layout.group)
    return full


# ---- plain data parallelism: the reference ------------------------------------------------

class DataParallel:
    """Full model and full Adam on every rank; gradients averaged with one all-reduce."""

    def __init__(self, model, layout, lr):
        self.model, self.layout = model, layout
        self.opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)

    def step(self):
        for p in self.model.parameters():
            dist.all_reduce(p.grad, group=self.layout.group)
            p.grad.div_(self.layout.world_size)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def full_parameters(self):
        return [p.detach().clone() for p in self.model.parameters()]


# ---- stages 1 and 2 ---------------------------------------------------------------------

class Zero12:
    """ZeRO stage 1 or 2 with Adam: the lesson's view of ``zero_optimizer.ZeroOptimizer``, which
    does the work (it averages the gradients itself, so no DDP). ``opt`` is the inner Adam,
    built on this rank's shards only; ``shards[i]`` is a view of ``flats[i]``, the padded flat
    buffer that holds parameter i."""

    def __init__(self, model, layout, lr, stage=1):
        self.model, self.layout, self.stage = model, layout, stage
        self.zero = ZeroOptimizer(model.parameters(), torch.optim.Adam, stage=stage,
                                  group=layout.group, lr=lr, foreach=False)
        self.opt = self.zero.optim
        self.params, self.flats, self.shards = self.zero.params, self.zero.flats, self.zero.shards

    def step(self):
        self.zero.step()  # stage 1: reduce-scatter now; Adam on the shards; all-gather
        self.zero.zero_grad(set_to_none=True)

    def full_parameters(self):
        return [p.detach().clone() for p in self.params]


# ---- stage 3 ----------------------------------------------------------------------------

class _GatheredLinear(torch.autograd.Function):
    """y = x W^T + b where only shards of W and b are kept: gather, use, drop; in backward
    gather W again and reduce-scatter the weight and bias gradients into shard gradients."""

    @staticmethod
    def forward(ctx, x, weight_shard, bias_shard, layer):
        ctx.save_for_backward(x, weight_shard, bias_shard)
        ctx.layer = layer
        weight, bias = layer.gather()
        return F.linear(x, weight, bias)  # weight and bias are freed on return

    @staticmethod
    def backward(ctx, grad_y):
        x, _, _ = ctx.saved_tensors
        layer, layout = ctx.layer, ctx.layer.layout
        weight, _ = layer.gather()
        grad_y = grad_y.to(weight.dtype)  # under bf16 autocast: gradients kept in fp32
        grad_x = grad_y @ weight
        grad_w = grad_y.reshape(-1, grad_y.shape[-1]).T @ x.reshape(-1, x.shape[-1]).to(weight.dtype)
        grad_b = grad_y.reshape(-1, grad_y.shape[-1]).sum(0)
        return (grad_x.to(x.dtype),
                reduce_scatter_mean(flat_padded(grad_w, layout.world_size), layout),
                reduce_scatter_mean(flat_padded(grad_b, layout.world_size), layout), None)


class Zero3Linear(nn.Module):
    """An ``nn.Linear`` of which this rank keeps only 1/world_size of the weight and bias."""

    def __init__(self, linear, layout):
        super().__init__()
        self.layout, self.weight_shape = layout, linear.weight.shape
        chunk = lambda t: flat_padded(t.detach(), layout.world_size).chunk(  # noqa: E731
            layout.world_size)[layout.rank].clone()
        self.weight_shard = nn.Parameter(chunk(linear.weight))
        self.bias_shard = nn.Parameter(chunk(linear.bias))

    def gather(self):
        n_w, n_b = self.weight_shape.numel(), self.weight_shape[0]
        weight = all_gather_flat(self.weight_shard.detach(), self.layout)[:n_w]
        bias = all_gather_flat(self.bias_shard.detach(), self.layout)[:n_b]
        return weight.view(self.weight_shape), bias

    def forward(self, x):
        return _GatheredLinear.apply(x, self.weight_shard, self.bias_shard, self)


class Zero3:
    """ZeRO stage 3: every ``nn.Linear`` replaced by a ``Zero3Linear``; Adam on the shards."""

    def __init__(self, model, layout, lr):
        self.layout = layout
        for name, child in list(model.named_children()):
            if isinstance(child, nn.Linear):
                setattr(model, name, Zero3Linear(child, layout))
        self.model = model
        self.opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)

    def step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def full_parameters(self):
        out = []
        for layer in self.model.children():
            if isinstance(layer, Zero3Linear):
                weight, bias = layer.gather()
                out += [weight.clone(), bias.clone()]
        return out


def wrap(stage, model, layout, lr):
    """Plain data parallelism (stage 0) or ZeRO stage 1, 2 or 3 around ``model``."""
    if stage == 0:
        return DataParallel(model, layout, lr)
    if stage in (1, 2):
        return Zero12(model, layout, lr, stage)
    if stage == 3:
        return Zero3(model, layout, lr)
    raise ValueError(f"ZeRO stage must be 0 (plain data parallel), 1, 2 or 3; got {stage!r}")


# ---- what the paper predicts --------------------------------------------------------------

def zero_volume_formula(stage):
    """Communication per step in units of one copy of the parameters (paper, section 7): an
    all-reduce is a reduce-scatter plus an all-gather (2), stage 3 gathers the weights twice."""
    return 3.0 if stage == 3 else 2.0


# ---- PyTorch's own ----------------------------------------------------------------------


class FSDP2:
    """PyTorch's FSDP2: ``fully_shard`` on each Linear and on the root (CPU mesh, gloo).
    ``param_dtype=torch.bfloat16``: the shards stay fp32, the all-gathered weights are bf16."""

    def __init__(self, model, layout, lr, param_dtype=None):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mesh = init_device_mesh("cpu", (layout.world_size,))
        # cast each shard to param_dtype before the all-gather (half the bytes for bf16);
        # reduce-scatter the gradients in fp32, into fp32 shards for Adam
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh, mp_policy=policy)
        self.model = fully_shard(model, mesh=mesh, mp_policy=policy)
        self.opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)

    def step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def full_parameters(self):
        return [p.full_tensor().detach() for p in self.model.parameters()]


def zero1_step(rank, world_size, flat, grad, shard, optimizer):
    """Reference: ``flat`` (the full weights, padded) and ``grad`` (this rank's full local
    gradient) are the same size; ``shard`` is this rank's slice of ``flat`` and the only
    tensor ``optimizer`` knows. Update ``flat`` in place as data parallelism would."""
    grad_shard = torch.empty_like(shard)
    dist.reduce_scatter_single(grad_shard, grad)          # my slice, summed over ranks
    shard.grad = grad_shard / world_size                  # the mean, as data parallelism
    optimizer.step()                                      # state exists for my slice only
    optimizer.zero_grad()
    dist.all_gather_single(flat, shard.detach().clone())  # every rank gets every slice
