"""Attention one key/value block at a time (06d2): a block's output and log-sum-exp, and the
online-softmax merge that makes blocks add up to attention over all keys (Milakov & Gimelshein
2018; FlashAttention; Liu et al. 2023, "Ring Attention"). ``labutils.parallel.ring_attention``
runs it on a ring of ranks.

A query row's attention over keys split into blocks A and B: with ``lse_X = log sum_{j in X}
exp(s_j)`` and ``out_X`` the softmax-weighted mean of X's values,

    lse = log(exp(lse_A) + exp(lse_B)),   out = exp(lse_A - lse) out_A + exp(lse_B - lse) out_B,

because each block's weights must be rescaled from its own sum to the total. Shapes: q
(B, H, Sq, D), k and v (B, H, Sk, D), out (B, H, Sq, D), lse (B, H, Sq).
"""
from __future__ import annotations

import math

import torch


def causal_mask(q_pos, k_pos):
    """(Sq, Sk) bool: query at global position i sees key at position j when j <= i."""
    return k_pos[None, :] <= q_pos[:, None]


def _finite(lse):
    # a row that sees no key of a block has lse = -inf; exp(s - (-inf)) would be NaN, while
    # the row's weights are exactly 0: subtract 0 instead
    return lse.masked_fill(torch.isinf(lse), 0.0)


def block_attention(q, k, v, mask):
    """Softmax attention of ``q`` over one block of keys, ``mask`` (Sq, Sk) True where a key
    is visible. Returns (out, lse); a row with no visible key has out 0 and lse -inf."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])      # (B, H, Sq, Sk)
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                             # (B, H, Sq)
    weights = torch.exp(scores - _finite(lse)[..., None])             # softmax over the block
    return weights @ v, lse


def merge_attention_blocks(out_a, lse_a, out_b, lse_b):
    """Attention over the keys of blocks a and b from each block's (out, lse)."""
    lse = torch.logaddexp(lse_a, lse_b)    # log(e^a + e^b), computed as max + log1p(e^-|a-b|)
    weight_a = torch.exp(lse_a - _finite(lse))[..., None]   # exponent <= 0: cannot overflow
    weight_b = torch.exp(lse_b - _finite(lse))[..., None]
    return weight_a * out_a + weight_b * out_b, lse


def block_attention_backward(q, k, v, mask, lse, dout, delta):
    """Gradients of the FULL attention's output with respect to q, k and v, from one block:
    its probabilities are exp(s - lse) with the final ``lse`` (over every key, saved by the
    forward), and ``delta`` = rowsum(dout * out) with the final output (FlashAttention 2,
    algorithm 2). Summing a block's (dq, dk, dv) over all blocks gives the full gradients."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * scale
    probs = torch.exp(scores - _finite(lse)[..., None]).masked_fill(~mask, 0.0)  # (B, H, Sq, Sk)
    dv = probs.transpose(-2, -1) @ dout
    dprobs = dout @ v.transpose(-2, -1)
    dscores = probs * (dprobs - delta[..., None])   # softmax's Jacobian, row by row
    return dscores @ k * scale, dscores.transpose(-2, -1) @ q * scale, dv


def attend_chunks(q, k, v, q_chunks, k_chunks):
    """``block_attention`` of the local queries over one rank's key block, chunk by chunk:
    ``q_chunks`` and ``k_chunks`` are the global position ranges the blocks hold, in order
    (one range for a contiguous split, two for zig-zag). A pair of chunks that no query-key
    pair of sees is skipped, so a rank's work is what the causal mask leaves."""
    outs, lses, q0 = [], [], 0
    for qr in q_chunks:
        q_part, q_pos = q[..., q0:q0 + len(qr), :], torch.arange(qr.start, qr.stop)
        out = lse = None
        k0 = 0
        for kr in k_chunks:
            mask = causal_mask(q_pos, torch.arange(kr.start, kr.stop))
            sl = slice(k0, k0 + len(kr))
            k0 += len(kr)
            if not bool(mask.any()):
                continue                                     # in the future: nothing to do
            o, lo = block_attention(q_part, k[..., sl, :], v[..., sl, :], mask)
            out, lse = (o, lo) if out is None else merge_attention_blocks(out, lse, o, lo)
        if out is None:                                      # this chunk sees none of the keys
            out = torch.zeros_like(q_part)
            lse = torch.full(q_part.shape[:-1], float("-inf"), dtype=q.dtype)
        outs.append(out)
        lses.append(lse)
        q0 += len(qr)
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)


def attend_chunks_backward(q, k, v, q_chunks, k_chunks, lse, dout, delta):
    """(dq, dk, dv) of one key block, chunk pair by chunk pair, skipping what
    ``attend_chunks`` skips."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    q0 = 0
    for qr in q_chunks:
        qs = slice(q0, q0 + len(qr))
        q0 += len(qr)
        k0 = 0
        for kr in k_chunks:
            ks = slice(k0, k0 + len(kr))
            k0 += len(kr)
            mask = causal_mask(torch.arange(qr.start, qr.stop), torch.arange(kr.start, kr.stop))
            if not bool(mask.any()):
                continue
            g = block_attention_backward(q[..., qs, :], k[..., ks, :], v[..., ks, :], mask,
                                         lse[..., qs], dout[..., qs, :], delta[..., qs])
            dq[..., qs, :] += g[0]
            dk[..., ks, :] += g[1]
            dv[..., ks, :] += g[2]
    return dq, dk, dv
