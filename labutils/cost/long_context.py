"""Cost terms of long sequences and mixtures of experts: Megatron sequence parallelism, ring
attention, DeepSpeed-Ulysses and expert parallelism, as bytes each rank sends and as alpha-beta
times (``costmodel``'s collectives). Labs 06d1-06d3 print them beside the bytes their ranks
count; the planner adds them to a step (07).

Every function is per transformer layer and per micro-batch on one rank. Bytes are what one rank
*sends* (so they compare across techniques); ``phase`` is "forward", "backward" or "both";
``recompute=True`` (full activation recomputation) repeats the forward's traffic in backward.
Widths: ``hidden`` is the width of Q and of the layer's activations, ``kv_hidden`` (default
``hidden``) that of K and of V; with tensor parallelism pass the per-rank widths (/ tp).
"""
from __future__ import annotations

import dataclasses
import math

from labutils.cost import costmodel as cm
from labutils.cost.plan_memory import layer_activation_bytes

PHASES = ("forward", "backward", "both")


def _phases(phase, forward, backward, recompute=False):
    """Combine a phase's counts: backward repeats the forward's under full recomputation."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}; got {phase!r}")
    backward = backward + (forward if recompute else 0)
    return {"forward": forward, "backward": backward, "both": forward + backward}[phase]


def _positive(**sizes):
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1; got {value!r}")


def _split(seq, world_size, what):
    _positive(seq=seq, world_size=world_size)
    if seq % world_size:
        raise ValueError(f"{what} splits the sequence: world_size={world_size} must divide "
                         f"seq={seq}; pad the sequence or pick a divisor")
    return seq // world_size


# ---- Megatron sequence parallelism (Korthikanti et al. 2022, section 4.2.2) ------------------

def sequence_parallel_bytes(seq, batch, hidden, world_size, bytes_per_element=2, phase="both",
                            recompute=False):
    """Bytes one rank sends for TP + sequence parallelism: tensor parallelism's 2 all-reduces
    per phase (f and g, each of s*b*h elements) become 2 reduce-scatter + all-gather pairs on
    the same s*b*h buffer; on a ring each of the 4 sends (t-1)/t of it, exactly what the 2 ring
    all-reduces sent (2 (t-1)/t each): the same bytes, twice the calls."""
    _positive(seq=seq, batch=batch, hidden=hidden, world_size=world_size)
    t = world_size
    per_phase = 4 * (t - 1) / t * seq * batch * hidden * bytes_per_element
    return _phases(phase, per_phase, per_phase, recompute)


def sequence_parallel_time(seq, batch, hidden, world_size, alpha, beta, bytes_per_element=2,
                           recompute=False, algorithm="ring"):
    """Seconds of one layer's reduce-scatter + all-gather pairs, forward and backward (2 each,
    + 2 with full recomputation); each collective on its own alpha-beta terms. On a ring the
    pair costs one all-reduce; other algorithms differ."""
    n = seq * batch * hidden * bytes_per_element
    pair = (cm.reduce_scatter_time(n, world_size, alpha, beta, algorithm)
            + cm.all_gather_time(n, world_size, alpha, beta, algorithm))
    return (6 if recompute else 4) * pair


def sequence_parallel_activations(model, layout, recompute="none"):
    """(without SP, with SP) bytes one layer keeps for backward: the planner's formula
    (``plan_memory.layer_activation_bytes``), its LayerNorm/dropout share divided by tp."""
    mode = {True: "full", False: "none"}.get(recompute, recompute)
    return tuple(layer_activation_bytes(model, dataclasses.replace(layout, sequence_parallel=sp),
                                        mode) for sp in (False, True))


# ---- ring attention (Liu et al. 2023; zhuzilin/ring-flash-attention) ------------------------

def ring_kv_bytes(seq, batch, hidden, world_size, bytes_per_element=2, phase="both",
                  kv_hidden=None):
    """Bytes one rank sends around the ring: forward, its K and V blocks (2 s/N b kv elements)
    travel N-1 hops; backward, K and V again (N-1 hops) plus the accumulated dK and dV, which
    travel all N hops back to their owner (ring-flash-attention's convention)."""
    _positive(batch=batch, hidden=hidden)
    block = 2 * _split(seq, world_size, "ring attention") * batch * (kv_hidden or hidden) \
        * bytes_per_element
    n = world_size
    if n == 1:
        return 0
    return _phases(phase, (n - 1) * block, (n - 1) * block + n * block)


def ring_attention_time(seq, batch, hidden, world_size, alpha, beta, flops_per_s,
                        kv_hidden=None, bytes_per_element=2, recompute=False):
    """(transfer, exposed) seconds of one layer's ring, on ``parallel.ring_attention``'s
    schedule. Attention on one block: 4 (s/N)^2 b h FLOPs forward, twice that backward, at
    ``flops_per_s``. Forward: K/V hop i (alpha + n beta) flies while block i is computed.
    Backward: K/V hop i flies during block i's backward, and the dK/dV hop posted after block i
    during block i+1's, so block 0 hides a K/V hop, blocks 1..N-2 a K/V and a dK/dV hop at
    once (modelled as one message of both), block N-1 a dK/dV hop, and the last dK/dV hop
    (home to its owner) is hidden by nothing. A simple model: exposed = max(0, transfer -
    compute) per block (no causal skipping, no kernel-launch overlap limits)."""
    n = world_size
    if n == 1:
        return 0.0, 0.0
    s_local = _split(seq, n, "ring attention")
    block = 2 * s_local * batch * (kv_hidden or hidden) * bytes_per_element     # K and V
    kv = cm.send_recv_time(block, n, alpha, beta)
    both = cm.send_recv_time(2 * block, n, alpha, beta)                         # + dK, dV
    fwd = 4 * s_local * s_local * batch * hidden / flops_per_s
    forwards = 2 if recompute else 1
    transfer = forwards * (n - 1) * kv + 2 * kv + (n - 2) * both + kv
    exposed = (forwards * (n - 1) * max(0.0, kv - fwd)
               + 2 * max(0.0, kv - 2 * fwd) + (n - 2) * max(0.0, both - 2 * fwd) + kv)
    return transfer, exposed


# ---- DeepSpeed-Ulysses (Jacobs et al. 2023) --------------------------------------------------

def ulysses_kv_heads(num_heads, num_kv_heads, world_size):
    """KV heads the all-to-alls carry: all-to-all gives each rank num_heads/N whole heads, so
    N must divide num_heads; KV heads that N does not divide are repeated up to lcm(kv, N)."""
    if num_heads % world_size:
        ok = [d for d in range(1, num_heads + 1) if num_heads % d == 0]
        raise ValueError(f"Ulysses gives each rank num_heads/N heads: N={world_size} must "
                         f"divide num_heads={num_heads}; use N in {ok} or ring attention")
    return math.lcm(num_kv_heads or num_heads, world_size)


def ulysses_bytes(seq, batch, hidden, world_size, bytes_per_element=2, phase="both",
                  kv_hidden=None):
    """Bytes one rank sends: 4 all-to-alls per phase (forward: q, k, v to head shards, out back
    to sequence shards; backward: their gradients), each keeping 1/N of an s/N b width buffer
    and sending (N-1)/N of it."""
    _positive(batch=batch, hidden=hidden)
    n, s_local = world_size, _split(seq, world_size, "Ulysses")
    width = 2 * hidden + 2 * (kv_hidden or hidden)                  # q and out, k and v
    per_phase = (n - 1) / n * s_local * batch * width * bytes_per_element
    return _phases(phase, per_phase, per_phase)


def ulysses_time(seq, batch, hidden, world_size, alpha, beta, kv_hidden=None,
                 bytes_per_element=2, recompute=False, algorithm="ring"):
    """Seconds of one layer's 8 all-to-alls (12 with full recomputation); nothing overlaps
    them: attention needs q, k, v, and the next layer needs out."""
    s_local, kv = _split(seq, world_size, "Ulysses"), kv_hidden or hidden
    one = sum(cm.all_to_all_time(s_local * batch * w * bytes_per_element, world_size, alpha,
                                 beta, algorithm) for w in (hidden, kv, kv, hidden))
    return (3 if recompute else 2) * one


# ---- expert parallelism (Lepikhin et al. 2021, GShard; Fedus et al. 2022, Switch) ------------

def expert_capacity(tokens, num_experts, top_k=1, capacity_factor=1.0):
    """Tokens one expert takes at most: capacity_factor x its even share of tokens x top_k."""
    _positive(tokens=tokens, num_experts=num_experts, top_k=top_k)
    return math.ceil(capacity_factor * tokens * top_k / num_experts)


def expert_all_to_all_bytes(tokens, hidden, world_size, top_k=1, capacity_factor=1.0,
                            bytes_per_element=2, phase="both", recompute=False):
    """Bytes one rank sends for one MoE layer: dispatch and combine all-to-alls forward, their
    gradients backward, each of tokens x top_k x capacity_factor slots of h elements, of which
    (N-1)/N go to other ranks (tokens routed evenly, padded to capacity)."""
    _positive(tokens=tokens, hidden=hidden, world_size=world_size, top_k=top_k)
    n = world_size
    per_phase = 2 * (n - 1) / n * tokens * top_k * capacity_factor * hidden * bytes_per_element
    return _phases(phase, per_phase, per_phase, recompute)


def expert_all_to_all_time(tokens, hidden, world_size, alpha, beta, top_k=1,
                           capacity_factor=1.0, bytes_per_element=2, recompute=False,
                           algorithm="ring"):
    """Seconds of one MoE layer's 4 all-to-alls (6 with full recomputation), not overlapped:
    the experts wait for their tokens and the next layer for the combined output."""
    n = tokens * top_k * capacity_factor * hidden * bytes_per_element
    return (6 if recompute else 4) * cm.all_to_all_time(n, world_size, alpha, beta, algorithm)
