"""Megatron sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", arXiv:2205.05198, section 4.2.2), on top of 06b's tensor parallelism.

Used by ``06d1_sequence_parallelism``. Under tensor parallelism of degree t the LayerNorms,
dropouts and residual adds sit outside the tensor-parallel blocks: every rank runs them on the
whole (B, T, H) activation and keeps the same copy for backward. Sequence parallelism splits
those regions along the sequence instead (each rank keeps T/t positions), and swaps 06b's
operators:

* g (all-reduce forward, identity backward) after the row-parallel linear becomes a
  **reduce-scatter** along the sequence forward, an **all-gather** backward;
* f (identity forward, all-reduce backward) before the column-parallel linear becomes an
  **all-gather** forward, a **reduce-scatter** backward.

An all-reduce of a buffer has the same result as a reduce-scatter of it followed by an
all-gather, so per phase the layer hands its collectives two sbh buffers to scatter and two
sbh/t shards to gather where tensor parallelism handed two sbh buffers to all-reduce (counted
at the dispatcher by ``sp_equivalence``); what crosses the wire depends on the backend's
algorithm and is only modelled (``sp_equivalence.ring_model_bytes``).

Memory: by default autograd keeps each column-parallel linear's all-gathered (whole-sequence)
input for backward. ``regather=True`` does what Megatron does instead (``GatheredColumnLinear``):
keep only the shard and all-gather it again in backward, one more all-gather per
column-parallel linear, for (1 - 1/t) of those inputs saved (``sp_memory``).

Layout: activations are (B, T, H) here, so a sequence shard is not one block of memory and the
collectives go through lists, ``cat`` and ``.contiguous()`` chunks. ``seq_first=True`` keeps them
(T, B, H), as Megatron-LM does: a shard is then contiguous, and ``all_gather_single`` /
``reduce_scatter_single`` read and write in place (06d1 times both).

The replicated parameters that act on a sequence shard (LayerNorm weights and biases, the
row-parallel biases) get only their shard's part of the gradient; ``allreduce_replicated_grads``
sums them, as Megatron does once per step (a few H-sized vectors, independent of T).
"""
from __future__ import annotations

import copy
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labutils.parallel.tensor_parallel import (
    MLP,
    ParallelMLP,
    ParallelSelfAttention,
    SelfAttention,
    validate_tp_config,
)

SEQ_DIM = 1  # activations are (batch, sequence, hidden); (sequence, batch, hidden) if seq_first


def validate_sp_config(hidden, num_heads, seq_len, tp_world_size):
    """06b's checks (hidden, MLP width and heads divide by t), plus the sequence length."""
    validate_tp_config(hidden, num_heads, tp_world_size)
    if seq_len % tp_world_size:
        ok = [p for p in range(1, min(seq_len, 8) + 1) if seq_len % p == 0]
        raise ValueError(f"sequence length {seq_len} is not divisible by the tensor-parallel "
                         f"size {tp_world_size}: each rank must hold an equal sequence shard. "
                         f"Use a tensor-parallel size in {ok}, or a sequence length that is a "
                         f"multiple of {tp_world_size}")


def _all_gather(x, layout):
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(layout.tp_world_size)]
    dist.all_gather(parts, x, group=layout.group)
    return torch.cat(parts, dim=SEQ_DIM)


def _reduce_scatter(x, layout):
    chunks = [c.contiguous() for c in x.chunk(layout.tp_world_size, dim=SEQ_DIM)]
    out = torch.empty_like(chunks[layout.tp_rank])
    dist.reduce_scatter(out, chunks, group=layout.group)
    return out


def _all_gather_seq_first(x, layout):
    # (T/t, B, H) shards, one contiguous block each: gathered in place, no list and no cat
    out = x.new_empty((layout.tp_world_size * x.shape[0], *x.shape[1:]))
    dist.all_gather_single(out, x.contiguous(), group=layout.group)
    return out


def _reduce_scatter_seq_first(x, layout):
    # (T, B, H): rank r's shard is rows r*T/t.., one block: no chunk copies
    out = x.new_empty((x.shape[0] // layout.tp_world_size, *x.shape[1:]))
    dist.reduce_scatter_single(out, x.contiguous(), group=layout.group)
    return out


def _gather(x, layout, seq_first):
    return (_all_gather_seq_first if seq_first else _all_gather)(x, layout)


def _scatter(x, layout, seq_first):
    return (_reduce_scatter_seq_first if seq_first else _reduce_scatter)(x, layout)


class GatherFromSequenceParallel(torch.autograd.Function):
    """Replaces f: all-gather the sequence shards forward; reduce-scatter the gradient backward
    (each rank's column slice contributed a partial gradient for every position)."""

    @staticmethod
    def forward(ctx, x, layout, seq_first=False):
        ctx.layout, ctx.seq_first = layout, seq_first
        return _gather(x, layout, seq_first)

    @staticmethod
    def backward(ctx, grad):
        return _scatter(grad, ctx.layout, ctx.seq_first), None, None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """Replaces g: sum the partial outputs and keep this rank's sequence shard forward;
    all-gather the gradient backward (every position's sum took a part from this rank)."""

    @staticmethod
    def forward(ctx, x, layout, seq_first=False):
        ctx.layout, ctx.seq_first = layout, seq_first
        return _scatter(x, layout, seq_first)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad.contiguous(), ctx.layout, ctx.seq_first), None, None


class GatheredColumnLinear(torch.autograd.Function):
    """f and a column-parallel linear in one, as Megatron does it: all-gather the sequence
    shards and multiply forward, saving only the *shard*; backward all-gathers it again (the
    extra call) for the weight gradient, and reduce-scatters the input gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, layout):
        ctx.layout = layout
        ctx.save_for_backward(x, weight)
        return F.linear(_all_gather(x, layout), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        full = _all_gather(x, ctx.layout)   # the re-gather
        grad_x = _reduce_scatter(grad @ weight, ctx.layout)
        grad_w = grad.reshape(-1, grad.shape[-1]).T @ full.reshape(-1, full.shape[-1])
        return grad_x, grad_w, grad.sum(dim=(0, 1)), None


def seeded_dropout(x, p, seed, full_shape, start=0, seq_first=False):
    """Dropout whose mask is drawn for the *full* (B, T, H) activation from a generator seeded
    with ``seed``, then sliced to the positions ``start:start + x.shape[1]`` this rank holds.

    Why the full draw: a generator fills a tensor element by element in order, so drawing only
    the shard's shape would give this rank the numbers of positions 0.. instead of its own,
    and the layer would no longer equal the single-process one. (Megatron keeps one RNG stream
    per tensor-parallel rank instead: masks differ from a single process, still independent.)
    """
    if p == 0:
        return x
    keep = torch.rand(full_shape, generator=torch.Generator().manual_seed(seed)) >= p
    # a copy, not a view: the mask autograd keeps is then the shard's, not the full draw's
    keep = keep.narrow(SEQ_DIM, start, x.shape[0 if seq_first else SEQ_DIM])
    keep = keep.transpose(0, 1).contiguous() if seq_first else keep.clone()
    return x * keep * (1.0 / (1.0 - p))  # autograd saves the bool mask: one byte an element


class PreLNTransformerLayer(nn.Module):
    """The single-process reference: x + drop(attn(LN(x))), then + drop(MLP(LN(x))), with
    06b's attention and MLP blocks."""

    def __init__(self, hidden, num_heads, dropout=0.1, seed=0):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn, self.mlp = SelfAttention(hidden, num_heads), MLP(hidden)
        self.dropout, self.seed = dropout, seed

    def _drop(self, x, which, full_shape, start=0):
        return seeded_dropout(x, self.dropout, self.seed + which, full_shape, start)

    def forward(self, x):
        x = x + self._drop(self.attn(self.ln1(x)), 0, x.shape)
        return x + self._drop(self.mlp(self.ln2(x)), 1, x.shape)


class SequenceParallelTransformerLayer(nn.Module):
    """The reference's weights split as in 06b (heads and MLP columns over t ranks).

    ``sequence_parallel=True``: input and output are this rank's (B, T/t, H) sequence shard;
    LayerNorm, dropout and residual run on the shard. ``False``: 06b's tensor parallelism with
    its f and g, input and output the whole (B, T, H) on every rank (the baseline).
    ``regather=True`` (with SP): the column-parallel linears keep only their input's shard.
    ``seq_first=True`` (with SP): input and output (T/t, B, H), as in Megatron-LM."""

    def __init__(self, layer, layout, sequence_parallel=True, regather=False, seq_first=False):
        super().__init__()
        if seq_first and (regather or not sequence_parallel):
            raise ValueError("seq_first=True is the (T, B, H) layout of sequence parallelism: "
                             "use it with sequence_parallel=True and regather=False")
        self.layout, self.sp, self.regather = layout, sequence_parallel, regather
        self.seq_first = seq_first
        self.ln1, self.ln2 = copy.deepcopy(layer.ln1), copy.deepcopy(layer.ln2)  # replicated
        self.attn = ParallelSelfAttention(layer.attn, layout)  # shards qkv (column), proj (row)
        self.mlp = ParallelMLP(layer.mlp, layout)              # shards fc1 (column), fc2 (row)
        self.dropout, self.seed = layer.dropout, layer.seed

    def _column(self, linear, x):
        # SP: gather the sequence shards, then the column slice of the weight (no f).
        if self.regather:
            return GatheredColumnLinear.apply(x, linear.weight, linear.bias, self.layout)
        return F.linear(GatherFromSequenceParallel.apply(x, self.layout, self.seq_first),
                        linear.weight, linear.bias)

    def _row(self, linear, x):
        # SP: reduce-scatter the partial sums (no g); the bias is added on the shard.
        return ReduceScatterToSequenceParallel.apply(F.linear(x, linear.weight), self.layout,
                                                     self.seq_first) + linear.bias

    def _attention(self, x):
        if not self.sp:
            return self.attn(x)
        qkv = self._column(self.attn.qkv, x)
        if self.seq_first:                    # attention itself wants (B, T, ...): views
            y = self.attn.attend(qkv.transpose(0, 1), self.attn.local_heads).transpose(0, 1)
        else:
            y = self.attn.attend(qkv, self.attn.local_heads)
        return self._row(self.attn.proj, y)

    def _mlp(self, x):
        if not self.sp:
            return self.mlp(x)
        return self._row(self.mlp.fc2, F.gelu(self._column(self.mlp.fc1, x)))

    def forward(self, x):
        t = self.layout.tp_world_size if self.sp else 1
        batch, local = (x.shape[1], x.shape[0]) if self.seq_first else (x.shape[0], x.shape[1])
        full = (batch, local * t, x.shape[2])             # the masks are drawn as (B, T, H)
        start = self.layout.tp_rank * local if self.sp else 0
        x = x + seeded_dropout(self._attention(self.ln1(x)), self.dropout, self.seed, full, start,
                               self.seq_first)
        return x + seeded_dropout(self._mlp(self.ln2(x)), self.dropout, self.seed + 1, full,
                                  start, self.seq_first)


def replicated_params(layer):
    """Parameters every rank holds whole but, under SP, sees only a sequence shard of: the
    LayerNorms and the row-parallel biases (added after the reduce-scatter)."""
    return [*layer.ln1.parameters(), *layer.ln2.parameters(), layer.attn.proj.bias,
            layer.mlp.fc2.bias]


def allreduce_replicated_grads(layer, layout):
    """Sum the replicated parameters' shard gradients over the group (one flat all-reduce);
    nothing to do without sequence parallelism."""
    if not layer.sp or layout.tp_world_size == 1:
        return
    params = replicated_params(layer)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, group=layout.group)
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(g.view_as(p))
