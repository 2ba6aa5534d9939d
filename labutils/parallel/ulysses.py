"""DeepSpeed-Ulysses sequence parallelism for attention (Jacobs et al. 2023, arXiv:2309.14509).

Used by ``06d2_context_parallelism``. Each of N ranks holds s/N positions of the sequence
and the whole (replicated) attention weights. It projects q, k, v for its positions; one
all-to-all per tensor trades "my positions, all heads" for "all positions, my heads/N heads";
causal attention then runs on the whole sequence for those heads, with no communication; one
all-to-all trades the output back to "my positions, all heads", and the output projection is
local. Four all-to-alls per layer forward (q, k, v, out), four backward (their gradients).

Each all-to-all keeps 1/N of its (s/N, b, h) buffer and sends (N-1)/N of it, so a rank sends
4 (N-1)/N * s/N * b * h elements per layer forward: the volume per rank falls like 1/N.
The constraint: N must divide the number of heads (each rank gets whole heads), so N <= heads.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labutils.core.i18n import tr


def validate_ulysses_config(num_heads, world_size, seq_len=None):
    """Refuse a split the all-to-all cannot make, before any process starts."""
    if world_size < 1:
        raise ValueError(tr("world_size must be >= 1; got {world_size}", world_size=world_size))
    if num_heads % world_size:
        ok = [d for d in range(1, num_heads + 1) if num_heads % d == 0]
        raise ValueError(tr("num_heads={num_heads} is not divisible by world_size={world_size}: "
                            "use a world size that divides {num_heads} ({ok}) or change "
                            "num_heads", num_heads=num_heads, world_size=world_size,
                            ok=", ".join(map(str, ok))))
    if seq_len is not None and seq_len % world_size:
        raise ValueError(tr("seq_len={seq_len} is not divisible by world_size={world_size}: "
                            "each rank holds seq_len/world_size positions; pad the sequence or "
                            "use a world size that divides {seq_len}", seq_len=seq_len,
                            world_size=world_size))


def _all_to_all(send, group):
    """``send`` is (N, ...): row j goes to rank j; returns (N, ...) with row j from rank j."""
    send = send.contiguous()        # before empty_like, which would copy a view's strides
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv


def _seq_to_heads(x, world_size, group):
    # (B, s/N, a, d) -> (B, s, a/N, d): send heads group j to rank j, receive positions from all
    B, s_local, a, d = x.shape
    send = x.reshape(B, s_local, world_size, a // world_size, d).permute(2, 0, 1, 3, 4)
    recv = _all_to_all(send, group)                            # (N src, B, s/N, a/N, d)
    return recv.permute(1, 0, 2, 3, 4).reshape(B, world_size * s_local, a // world_size, d)


def _heads_to_seq(x, world_size, group):
    # (B, s, a/N, d) -> (B, s/N, a, d): send positions block j to rank j, receive its heads
    B, s, a_local, d = x.shape
    send = x.reshape(B, world_size, s // world_size, a_local, d).transpose(0, 1)
    recv = _all_to_all(send, group)                            # (N src, B, s/N, a/N, d)
    return recv.permute(1, 2, 0, 3, 4).reshape(B, s // world_size, world_size * a_local, d)


class SeqToHeads(torch.autograd.Function):
    """All-to-all from sequence shards to head shards; backward is the reverse all-to-all
    (an all-to-all is a permutation of blocks, so its gradient is the inverse permutation)."""

    @staticmethod
    def forward(ctx, x, world_size, group=None):
        ctx.args = (world_size, group)
        return _seq_to_heads(x, world_size, group)

    @staticmethod
    def backward(ctx, grad):
        return _heads_to_seq(grad, *ctx.args), None, None


class HeadsToSeq(torch.autograd.Function):
    """All-to-all from head shards back to sequence shards; backward goes the other way."""

    @staticmethod
    def forward(ctx, x, world_size, group=None):
        ctx.args = (world_size, group)
        return _heads_to_seq(x, world_size, group)

    @staticmethod
    def backward(ctx, grad):
        return _seq_to_heads(grad, *ctx.args), None, None


class UlyssesAttention(nn.Module):
    """06b's ``SelfAttention`` (its weights, replicated) on a sequence shard: input and output
    are this rank's (B, s/N, H) positions, attention runs on all s positions for a/N heads."""

    def __init__(self, attn, world_size, group=None):
        super().__init__()
        validate_ulysses_config(attn.num_heads, world_size)
        self.qkv, self.proj = copy.deepcopy(attn.qkv), copy.deepcopy(attn.proj)  # replicated
        self.num_heads = attn.num_heads
        self.world_size, self.group = world_size, group

    def forward(self, x):
        B, s_local, H = x.shape
        q, k, v = (SeqToHeads.apply(t.view(B, s_local, self.num_heads, -1), self.world_size,
                                    self.group)
                   for t in self.qkv(x).chunk(3, dim=-1))         # each (B, s, a/N, d)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        y = HeadsToSeq.apply(y.transpose(1, 2), self.world_size, self.group)  # (B, s/N, a, d)
        return self.proj(y.reshape(B, s_local, H))
