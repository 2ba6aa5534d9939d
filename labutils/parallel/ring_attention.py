"""Context parallelism by ring attention (06d2; Liu et al. 2023, "Ring Attention with Blockwise
Transformers", arXiv:2310.01889): each rank holds the queries, keys and values of its part of
the sequence; the key/value blocks travel round the ring of ranks, and each rank merges its
queries' attention over every block it receives with the online softmax
(``labutils.parallel.online_softmax``). No rank ever holds the whole sequence's K and V.

The transfer of the next block is posted (``dist.isend``/``dist.irecv``) before the rank computes
on the current one, so sending and computing can overlap (``overlap=False`` posts it after, the
serial variant to compare with). The backward pass runs the ring again: each block's dK/dV
accumulator follows one hop behind it, collects every rank's share and arrives back at its owner
after N hops; it is waited for only after the next block's backward (as ring-flash-attention
does), so only the last dK/dV hop has no compute to overlap. Nothing here counts or times:
``experiments/ring_trace`` observes the ring from outside (the dispatcher sees every send).

Causal attention gives rank r of a contiguous split r+1 blocks of work and the last rank N.
The zig-zag split (used by ring-flash-attention's zigzag ring and by the context parallelism of
Megatron-LM and torchtitan for Llama 3) cuts the sequence into 2N chunks and gives rank r chunks
r and 2N-1-r, so every rank does the same work. (Striped Attention, Brandon et al. 2023, balances
by assigning tokens round-robin instead: rank r holds positions r, r+N, r+2N, ...)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from labutils.parallel.online_softmax import (
    attend_chunks,
    attend_chunks_backward,
    merge_attention_blocks,
)

LAYOUTS = ("contiguous", "zigzag")
KV_TAG, GRAD_TAG = 0, 1    # two streams on one ring: blocks forward, dK/dV accumulators
STREAMS = {KV_TAG: "K/V", GRAD_TAG: "dK/dV"}


def validate_ring(seq, world_size, layout):
    """Refuse a split the ring cannot make, before any process starts."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    parts = world_size * (2 if layout == "zigzag" else 1)
    if seq % parts:
        fits = [n for n in range(1, 9) if seq % (n * (2 if layout == "zigzag" else 1)) == 0]
        raise ValueError(f"a sequence of {seq} positions cannot be cut into {parts} equal "
                         f"chunks ({layout} on {world_size} ranks): use a world size in {fits}"
                         f" or a sequence length divisible by {parts}")


@dataclass(frozen=True)
class RingLayout:
    """Which global positions of a ``seq``-long sequence each of ``world_size`` ranks holds."""
    seq: int
    world_size: int
    kind: str = "contiguous"

    def __post_init__(self):
        validate_ring(self.seq, self.world_size, self.kind)

    def chunks(self, rank):
        """The rank's position ranges, in the order its local block stores them."""
        n = self.world_size
        if self.kind == "contiguous":
            size = self.seq // n
            return [range(rank * size, (rank + 1) * size)]
        size = self.seq // (2 * n)
        return [range(c * size, (c + 1) * size) for c in (rank, 2 * n - 1 - rank)]

    def positions(self, rank):
        return torch.cat([torch.arange(r.start, r.stop) for r in self.chunks(rank)])

    def shard(self, x, rank):
        """The rank's part of ``x`` (..., seq, D): what the rank holds."""
        return x[..., self.positions(rank), :]

    def unshard(self, parts):
        """The per-rank parts (rank order) put back into sequence order."""
        order = torch.cat([self.positions(r) for r in range(self.world_size)])
        return torch.cat(parts, dim=-2)[..., torch.argsort(order), :]


def ring_shift(t, rank, world_size, tag, group=None):
    """Post: send ``t`` to the next rank, receive the previous rank's into a new buffer.
    Returns (requests to wait on, the buffer). Nothing moves on a ring of one. ``rank`` and
    ``world_size`` are those of ``group`` (None: the default group): a ring over a context-
    parallel group of a larger mesh (06e) numbers its ranks within the group."""
    if world_size == 1:
        return [], t
    buf, t = torch.empty_like(t), t.contiguous()
    src, dst = (rank - 1) % world_size, (rank + 1) % world_size
    if group is None:
        reqs = [dist.irecv(buf, src=src, tag=tag), dist.isend(t, dst=dst, tag=tag)]
    else:                                         # addressed by rank within the group
        reqs = [dist.irecv(buf, group=group, group_src=src, tag=tag),
                dist.isend(t, group=group, group_dst=dst, tag=tag)]
    return reqs, buf


def wait(reqs):
    """Block until the posted send and receive are done (the received buffer is ready)."""
    for r in reqs:
        r.wait()


def ring_attention_forward(q, k, v, layout, rank, overlap=True, group=None):
    """Causal attention of this rank's queries over the whole sequence: (out, lse) for the
    rank's positions. ``overlap=False`` is the serial variant, for comparison: each hop is
    posted only after computing, so nothing is in flight while the rank computes."""
    world_size = layout.world_size
    kv = torch.stack([k, v])                      # one message per hop: K and V together
    out = lse = None
    for step in range(world_size):
        src = (rank - step) % world_size          # whose block this rank holds now
        hop = step + 1 < world_size
        if hop and overlap:                       # post the next hop BEFORE computing
            reqs, next_kv = ring_shift(kv, rank, world_size, KV_TAG, group)
        o, lo = attend_chunks(q, kv[0], kv[1], layout.chunks(rank), layout.chunks(src))
        out, lse = (o, lo) if out is None else merge_attention_blocks(out, lse, o, lo)
        if hop and not overlap:                   # serial: post only now, then wait at once
            reqs, next_kv = ring_shift(kv, rank, world_size, KV_TAG, group)
        if hop:
            wait(reqs)
            kv = next_kv
    return out, lse


def ring_attention_backward(q, k, v, out, lse, dout, layout, rank, group=None):
    """(dq, dk, dv) of this rank's q, k, v: K/V go round the ring again, and each block's dK/dV
    accumulator follows one hop behind: every rank adds its share and passes it on; after N
    hops it is home. Both transfers overlap compute: the K/V hop is posted before the block's
    backward, and the dK/dV hop posted after it is waited for only after the NEXT block's."""
    world_size = layout.world_size
    delta = (dout * out).sum(-1)                  # rowsum(dO * O), with the final output
    dq = torch.zeros_like(q)
    kv = torch.stack([k, v])
    grad_reqs = next_dkv = None                   # no accumulator arrives before block 0
    for step in range(world_size):
        src = (rank - step) % world_size
        hop = step + 1 < world_size
        if hop:                                   # post the next K/V hop BEFORE computing
            kv_reqs, next_kv = ring_shift(kv, rank, world_size, KV_TAG, group)
        g = attend_chunks_backward(q, kv[0], kv[1], layout.chunks(rank), layout.chunks(src),
                                   lse, dout, delta)
        dq += g[0]
        dkv = torch.stack(g[1:])                  # this rank's share of block src's dK/dV
        if grad_reqs is not None:                 # block src's accumulator, from rank - 1,
            wait(grad_reqs)                       # in flight while we computed
            dkv = dkv + next_dkv
        if hop:
            wait(kv_reqs)
            kv = next_kv
        grad_reqs, next_dkv = ring_shift(dkv, rank, world_size, GRAD_TAG, group)  # next block
    wait(grad_reqs)                               # home: our block's sum, exposed
    return dq, next_dkv[0], next_dkv[1]


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's (q, k, v) over the ring; backward by the ring too."""

    @staticmethod
    def forward(ctx, q, k, v, layout, rank, group=None):
        out, lse = ring_attention_forward(q, k, v, layout, rank, group=group)
        ctx.save_for_backward(q, k, v, out, lse)   # lse: the backward needs no second softmax
        ctx.layout, ctx.rank, ctx.group = layout, rank, group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_attention_backward(q, k, v, out, lse, dout.contiguous(), ctx.layout,
                                             ctx.rank, ctx.group)
        return dq, dk, dv, None, None, None


def ring_attention(q, k, v, layout, rank, group=None):
    """Differentiable ring attention on ``group`` (None: the default process group; ``rank``
    is the rank within it)."""
    return RingAttention.apply(q, k, v, layout, rank, group)


def reference_attention(q, k, v):
    """The single-process reference: PyTorch's causal attention over the whole sequence."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def qkv(seq, heads=4, head_dim=16, batch=1, seed=0, dtype=torch.float64):
    """Full-sequence q, k, v and an upstream gradient, the same on every rank (one seed)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, seq, head_dim, generator=g, dtype=dtype) for _ in range(4)]
