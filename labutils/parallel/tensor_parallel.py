"""Megatron-LM tensor parallelism from scratch (Shoeybi et al., arXiv:1909.08053, section 3).

Used by ``06b_tensor_parallel`` (and by the data x tensor mesh of ``06c_sharding_and_memory``).
A linear layer ``Y = X W^T + b`` is split across the ``tp_world_size`` ranks of a group:

* ``ColumnParallelLinear`` keeps rows ``W[r]`` of the weight (a slice of the *output* features);
  its input must be the same on every rank, which the **f** operator guarantees (identity
  forward, all-reduce of the input gradient backward).
* ``RowParallelLinear`` keeps columns of ``W`` (a slice of the *input* features); its partial
  outputs are summed by the **g** operator (all-reduce forward, identity backward).

Column then row (MLP: fc1, fc2; attention: qkv, proj) needs one all-reduce forward and one
backward per block, and no communication in between (the paper's figure 3).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from labutils.core.launcher import launch

# ---- layout and communication bookkeeping ---------------------------------------------

@dataclass
class CommCounter:
    """Bytes handed to collectives, per (operator, phase): what a layer costs on the wire."""
    records: list = field(default_factory=list)

    def add(self, op, phase, nbytes):
        self.records.append((op, phase, int(nbytes)))

    def bytes(self, phase=None):
        return sum(b for _, p, b in self.records if phase in (None, p))

    def calls(self, phase=None):
        return sum(1 for _, p, _ in self.records if phase in (None, p))


@dataclass(frozen=True)
class TPLayout:
    """Where this rank sits in its tensor-parallel group (``group=None``: the whole world)."""
    tp_rank: int
    tp_world_size: int
    group: object = None
    counter: CommCounter | None = None


def validate_tp_config(hidden, num_heads=None, tp_world_size=2, ffn_hidden=None):
    """Refuse a split that does not divide evenly, before any process starts."""
    if tp_world_size < 1:
        raise ValueError(f"tp_world_size must be >= 1; got {tp_world_size}")
    ffn_hidden = 4 * hidden if ffn_hidden is None else ffn_hidden
    for name, value in (("hidden size", hidden), ("MLP hidden size", ffn_hidden),
                        ("number of attention heads", num_heads)):
        if value is not None and value % tp_world_size:
            ok = [p for p in range(1, value + 1) if value % p == 0 and p <= 8]
            raise ValueError(f"{name} {value} is not divisible by the tensor-parallel size "
                             f"{tp_world_size}: each rank must get an equal slice. Use a "
                             f"tensor-parallel size in {ok}, or a {name} that is a multiple "
                             f"of {tp_world_size}")
    if num_heads is not None and hidden % num_heads:
        raise ValueError(f"hidden size {hidden} is not divisible by {num_heads} heads; "
                         f"choose heads dividing the hidden size")


def _all_reduce(x, layout, op_name, phase):
    if layout.tp_world_size > 1:  # one rank holds everything: nothing to send
        if layout.counter is not None:
            layout.counter.add(op_name, phase, x.numel() * x.element_size())
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
        return _all_reduce(grad.contiguous().clone(), ctx.layout, "f", "backward"), None


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: all-reduce the partial outputs forward; identity backward (the sum's gradient)."""

    @staticmethod
    def forward(ctx, x, layout):
        return _all_reduce(x.contiguous().clone(), layout, "g", "forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GatherFromTensorParallel(torch.autograd.Function):
    """All-gather the last dimension forward; keep this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x, layout):
        ctx.layout = layout
        if layout.counter is not None:
            layout.counter.add("gather", "forward", x.numel() * x.element_size())
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
    if name.endswith("proj.bias") or name.endswith("fc2.bias"):
        return grad                                    # row-parallel bias: replicated
    if name.startswith("qkv"):
        return shard(grad, layout, 0, groups=3)
    if name.startswith(("fc2", "proj")):
        return shard(grad, layout, 1)
    return shard(grad, layout, 0)


# ---- workers: parallel block vs single-process block, on real ranks ---------------------
# The ranks only run the parallel block and send back what they computed; the caller runs the
# single-process reference and asserts equality (one process pays for torch.testing's imports).

def _reference_and_inputs(block, batch, seq, hidden, num_heads, seed):
    torch.manual_seed(seed)  # every rank builds the same reference, input and upstream gradient
    ref = MLP(hidden) if block == "mlp" else SelfAttention(hidden, num_heads)
    x = torch.randn(batch, seq, hidden)
    dy = torch.randn(batch, seq, hidden)  # a random upstream gradient exercises every path
    return ref, x, dy


def _forward_backward(model, x, dy):
    x = x.clone().requires_grad_()
    y = model(x)
    (y * dy).sum().backward()
    return y.detach(), x.grad, {n: p.grad for n, p in model.named_parameters()}


def parallel_block(rank, world_size, block="mlp", batch=2, seq=4, hidden=16, num_heads=4,
                   seed=0):
    """Worker: build the tensor-parallel block from the seeded reference, run forward and
    backward, count the bytes each collective carried."""
    ref, x, dy = _reference_and_inputs(block, batch, seq, hidden, num_heads, seed)
    layout = TPLayout(rank, world_size, counter=CommCounter())
    par = ParallelMLP(ref, layout) if block == "mlp" else ParallelSelfAttention(ref, layout)
    x = x.clone().requires_grad_()
    y = par(x)
    forward = (layout.counter.bytes("forward"), layout.counter.calls("forward"))
    (y * dy).sum().backward()
    return {"output": y.detach(), "input_grad": x.grad,
            "grads": {n: p.grad for n, p in par.named_parameters()},
            "forward_bytes": forward[0], "forward_calls": forward[1],
            "backward_bytes": layout.counter.bytes("backward"),
            "backward_calls": layout.counter.calls("backward")}


def assert_matches_reference(results, block, batch=2, seq=4, hidden=16, num_heads=4, seed=0):
    """Assert every rank's output, input gradient and parameter-gradient slice equal the
    single-process block's; return the largest absolute difference of each, over ranks."""
    ref, x, dy = _reference_and_inputs(block, batch, seq, hidden, num_heads, seed)
    y_ref, x_grad_ref, grads_ref = _forward_backward(ref, x, dy)
    world_size, max_diff = len(results), {}

    def check(what, got, expected, rank):
        torch.testing.assert_close(got, expected, msg=lambda m: f"rank {rank}, {what}: {m}")
        max_diff[what] = max(max_diff.get(what, 0.0), (got - expected).abs().max().item())

    for rank, res in enumerate(results):
        check("output", res["output"], y_ref, rank)
        check("input grad", res["input_grad"], x_grad_ref, rank)
        layout = TPLayout(rank, world_size)
        for name, grad in res["grads"].items():
            check(f"{name} grad", grad, reference_shards(name, grads_ref[name], layout), rank)
    return max_diff


def run_block_check(block="mlp", tp_world_size=2, batch=2, seq=4, hidden=16, num_heads=4,
                    seed=0):
    """Check the configuration, run ``parallel_block`` on ``tp_world_size`` ranks, assert it
    equals the single-process block. Returns max differences and bytes per rank."""
    if block not in ("mlp", "attention"):
        raise ValueError(f"block must be 'mlp' or 'attention'; got {block!r}")
    validate_tp_config(hidden, num_heads if block == "attention" else None, tp_world_size)
    args = (block, batch, seq, hidden, num_heads, seed)
    results = launch(parallel_block, *args, world_size=tp_world_size,
                     warn_oversubscription=False)
    max_diff = assert_matches_reference(results, *args)
    keys = ("forward_bytes", "forward_calls", "backward_bytes", "backward_calls")
    return {"max_abs_diff": max_diff, **{k: results[0][k] for k in keys},
            "param_shapes": {n: tuple(g.shape) for n, g in results[0]["grads"].items()}}


def dtensor_mlp(rank, world_size, batch=2, seq=4, hidden=16, seed=0):
    """Worker: the same MLP through PyTorch's ``parallelize_module`` on a CPU DeviceMesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    model, x, dy = _reference_and_inputs("mlp", batch, seq, hidden, None, seed)
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    with CommDebugMode() as comm:
        y, x_grad, grads = _forward_backward(model, x, dy)
    return {"output": y, "input_grad": x_grad,
            "grads": {n: g.to_local() for n, g in grads.items()},  # this rank's shard
            "full_grads": {n: g.full_tensor() for n, g in grads.items()},
            "placements": {n: str(p.placements[0]) for n, p in model.named_parameters()},
            "comm_counts": {str(k).split(".")[-1]: v
                            for k, v in comm.get_comm_counts().items()}}


def run_dtensor_check(tp_world_size=2, batch=2, seq=4, hidden=16, seed=0):
    """``parallelize_module`` (ColwiseParallel fc1, RowwiseParallel fc2) on real ranks:
    asserted equal to the single-process MLP, and its local shards to ``ParallelMLP``'s."""
    validate_tp_config(hidden, None, tp_world_size)
    results = launch(dtensor_mlp, batch, seq, hidden, seed, world_size=tp_world_size,
                     warn_oversubscription=False)
    max_diff = assert_matches_reference(results, "mlp", batch, seq, hidden, 4, seed)
    ref, x, dy = _reference_and_inputs("mlp", batch, seq, hidden, None, seed)
    _, _, grads_ref = _forward_backward(ref, x, dy)
    for res in results:
        for name, g in res["full_grads"].items():
            torch.testing.assert_close(g, grads_ref[name])
    return {"max_abs_diff": max_diff, "placements": results[0]["placements"],
            "comm_counts": results[0]["comm_counts"]}


def column_parallel_linear(rank, world_size, x, weight_shard, bias_shard):
    """Reference: this rank holds rows ``weight_shard`` (out/p, in) of W; return the full
    ``x W^T + b`` (B, out) on every rank."""
    y_local = F.linear(x, weight_shard, bias_shard)            # (B, out/p): my output features
    parts = [torch.empty_like(y_local) for _ in range(world_size)]
    dist.all_gather(parts, y_local)
    return torch.cat(parts, dim=-1)                             # (B, out), rank order
