"""Megatron-LM tensor parallelism from scratch (Shoeybi et al., arXiv:1909.08053, section 3).

Used by ``06b_tensor_parallel``, by the data x tensor mesh ``mesh_2d`` and by
``06e_composed_parallelism`` (``composed``).
A linear layer ``Y = X W^T + b`` is split across the ``tp_world_size`` ranks of a group:

* ``ColumnParallelLinear`` keeps rows ``W[r]`` of the weight (a slice of the *output* features);
  its input must be the same on every rank, which the **f** operator guarantees (identity
  forward, all-reduce of the input gradient backward).
* ``RowParallelLinear`` keeps columns of ``W`` (a slice of the *input* features); its partial
  outputs are summed by the **g** operator (all-reduce forward, identity backward).

Column then row (MLP: fc1, fc2; attention: qkv, proj) needs one all-reduce forward and one
backward per block, and no communication in between (the paper's figure 3): a transformer layer
(attention, then MLP) makes four, each on the critical path here, because the very next
operation needs its result (Megatron-LM hides f's backward all-reduce behind the
weight-gradient matmul; see 06b section 6).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labutils.core.i18n import tr

# ---- layout -------------------------------------------------------------------------------

@dataclass(frozen=True)
class TPLayout:
    """Where this rank sits in its tensor-parallel group (``group=None``: the whole world)."""
    tp_rank: int
    tp_world_size: int
    group: object = None


def validate_tp_config(hidden, num_heads=None, tp_world_size=2, ffn_hidden=None):
    """Refuse a split that does not divide evenly, before any process starts."""
    if tp_world_size < 1:
        raise ValueError(f"tp_world_size must be >= 1; got {tp_world_size}")
    ffn_hidden = 4 * hidden if ffn_hidden is None else ffn_hidden
    for name, value in ((tr("hidden size"), hidden), (tr("MLP hidden size"), ffn_hidden),
                        (tr("number of attention heads"), num_heads)):
        if value is not None and value % tp_world_size:
            ok = [p for p in range(1, value + 1) if value % p == 0 and p <= 8]
            raise ValueError(tr("{name} {value} is not divisible by the tensor-parallel size "
                                "{tp}: each rank must get an equal slice. Use a tensor-parallel "
                                "size in {ok}, or a {name} that is a multiple of {tp}",
                                name=name, value=value, tp=tp_world_size, ok=ok))
    if num_heads is not None and hidden % num_heads:
        raise ValueError(tr("hidden size {hidden} is not divisible by {heads} heads; choose "
                            "heads dividing the hidden size", hidden=hidden, heads=num_heads))


def _all_reduce(x, layout):
    if layout.tp_world_size > 1:  # one rank holds everything: nothing to send
        dist.all_reduce(x, group=layout.group)
    return x


# ---- the f and g operators (Megatron-LM, arXiv:1909.08053, figure 3) ------------------

class CopyToTensorParallel(torch.autograd.Function):
    """f: identity forward; all-reduce the input gradient backward (each rank holds a part)."""

    @staticmethod
    def forward(ctx, x, layout):
        ctx.layout = layout
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad.contiguous().clone(), ctx.layout), None


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: all-reduce the partial outputs forward; identity backward (the sum's gradient)."""

    @staticmethod
    def forward(ctx, x, layout):
        return _all_reduce(x.contiguous().clone(), layout)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GatherFromTensorParallel(torch.autograd.Function):
    """All-gather the last dimension forward; keep this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x, layout):
        ctx.layout = layout
        parts = [torch.empty_like(x) for _ in range(layout.tp_world_size)]
        dist.all_gather(parts, x.contiguous(), group=layout.group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.layout.tp_world_size, dim=-1)[ctx.layout.tp_rank].contiguous(), None


def shard(tensor, layout, dim, groups=1):
    """This rank's slice of ``tensor`` along ``dim``; with ``groups=3`` (a fused q,k,v weight)
    each of the 3 blocks is sliced, so every rank gets whole heads of q, k and v."""
    blocks = tensor.chunk(groups, dim=dim)
    mine = [b.chunk(layout.tp_world_size, dim=dim)[layout.tp_rank] for b in blocks]
    return torch.cat(mine, dim=dim).detach().clone()


# ---- parallel layers ----------------------------------------------------------------------

class ColumnParallelLinear(nn.Module):
    """Y_r = f(X) W_r^T + b_r: this rank's output features; ``gather_output`` joins them."""

    def __init__(self, linear, layout, gather_output=False, groups=1):
        super().__init__()
        self.layout, self.gather_output = layout, gather_output
        self.weight = nn.Parameter(shard(linear.weight, layout, 0, groups))  # (out/p, in)
        self.bias = (nn.Parameter(shard(linear.bias, layout, 0, groups))
                     if linear.bias is not None else None)

    def forward(self, x):
        y = F.linear(CopyToTensorParallel.apply(x, self.layout), self.weight, self.bias)
        return GatherFromTensorParallel.apply(y, self.layout) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """Y = g(sum_r X_r W_r^T) + b: the input arrives split by features (from a column layer)."""

    def __init__(self, linear, layout):
        super().__init__()
        self.layout = layout
        self.weight = nn.Parameter(shard(linear.weight, layout, 1))  # (out, in/p)
        # The bias is added once, after the sum; every rank holds all of it.
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None

    def forward(self, x_parallel):
        y = ReduceFromTensorParallel.apply(F.linear(x_parallel, self.weight), self.layout)
        return y + self.bias if self.bias is not None else y


# ---- single-process reference blocks and their parallel versions ---------------------

class MLP(nn.Module):
    """The transformer MLP: Linear(H, 4H), GELU, Linear(4H, H)."""

    def __init__(self, hidden, ffn_hidden=None):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn_hidden or 4 * hidden)
        self.fc2 = nn.Linear(ffn_hidden or 4 * hidden, hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class ParallelMLP(nn.Module):
    """fc1 column-parallel, GELU on each rank's slice (no communication), fc2 row-parallel."""

    def __init__(self, mlp, layout):
        super().__init__()
        self.fc1 = ColumnParallelLinear(mlp.fc1, layout)
        self.fc2 = RowParallelLinear(mlp.fc2, layout)

    def forward(self, x):                     # (B, T, H), the same on every rank
        return self.fc2(F.gelu(self.fc1(x)))  # (B, T, 4H/p) in between


class SelfAttention(nn.Module):
    """Causal multi-head self-attention with a fused q,k,v projection."""

    def __init__(self, hidden, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def attend(self, qkv, num_heads):
        B, T, _ = qkv.shape
        q, k, v = (t.view(B, T, num_heads, -1).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, heads, T, hd)
        return y.transpose(1, 2).reshape(B, T, -1)

    def forward(self, x):
        return self.proj(self.attend(self.qkv(x), self.num_heads))


class ParallelSelfAttention(nn.Module):
    """Heads split across ranks: each rank owns num_heads/p whole heads, so attention itself
    needs no communication; qkv is column-parallel, the output projection row-parallel."""

    def __init__(self, attn, layout):
        super().__init__()
        self.local_heads = attn.num_heads // layout.tp_world_size
        self.qkv = ColumnParallelLinear(attn.qkv, layout, groups=3)
        self.proj = RowParallelLinear(attn.proj, layout)
        self.attend = attn.attend

    def forward(self, x):
        return self.proj(self.attend(self.qkv(x), self.local_heads))


class TransformerLayer(nn.Module):
    """x + attention(x), then + MLP(x): a transformer layer (its layer norms, replicated and
    silent under tensor parallelism, are left out)."""

    def __init__(self, hidden, num_heads):
        super().__init__()
        self.attn, self.mlp = SelfAttention(hidden, num_heads), MLP(hidden)

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


class ParallelTransformerLayer(TransformerLayer):
    """Both blocks tensor-parallel: f and g of attention, then f and g of the MLP."""

    def __init__(self, layer, layout):
        nn.Module.__init__(self)
        self.attn = ParallelSelfAttention(layer.attn, layout)
        self.mlp = ParallelMLP(layer.mlp, layout)


# ---- what the paper predicts ------------------------------------------------------------

def comm_bytes_formula(batch, seq, hidden, tp_world_size, dtype_bytes=4):
    """Per block (MLP or attention): one all-reduce of the (B, T, H) activation forward (g) and
    one backward (f). Payload = B*T*H*bytes; a ring all-reduce moves 2(p-1)/p of it per rank."""
    payload = batch * seq * hidden * dtype_bytes if tp_world_size > 1 else 0
    ring = 2 * (tp_world_size - 1) / tp_world_size
    return {"forward": payload, "backward": payload,
            "forward_ring_per_rank": payload * ring, "backward_ring_per_rank": payload * ring}


def reference_shards(name, grad, layout):
    """The slice of a single-process gradient that the parallel parameter ``name`` owns."""
    leaf = ".".join(name.split(".")[-2:])              # "attn.qkv.weight" -> "qkv.weight"
    if leaf in ("proj.bias", "fc2.bias"):
        return grad                                    # row-parallel bias: replicated
    if leaf.startswith("qkv"):
        return shard(grad, layout, 0, groups=3)
    if leaf.startswith(("fc2", "proj")):
        return shard(grad, layout, 1)
    return shard(grad, layout, 0)
