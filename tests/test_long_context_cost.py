"""Tests of labutils.cost.long_context (sequence, context and expert parallelism's cost terms),
the all-to-all of costmodel, and how the planner adds them: bytes are checked against schedules
simulated here (every block a rank sends is counted), times against costmodel's collectives."""
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from labutils import costmodel as cm
from labutils import long_context as lc
from labutils import plan_memory as pm
from labutils import planner as pl

pytestmark = [pytest.mark.lab06d1, pytest.mark.lab06d2, pytest.mark.lab07]

A, B = 5e-6, 1 / 50e9      # 5 us, 50 GB/s


# ---- costmodel: all-to-all ------------------------------------------------------------------

@pytest.mark.parametrize("p", [2, 3, 8, 64])
def test_all_to_all_closed_forms(p):
    n, L = 8 << 20, math.ceil(math.log2(p))
    assert cm.all_to_all_time(n, p, A, B) == pytest.approx((p - 1) * (A + n / p * B))
    assert cm.all_to_all_time(n, p, A, B, "recursive_doubling") == pytest.approx(
        L * A + L / 2 * n * B)
    assert cm.collective_time("all_to_all", n, p, A, B) == cm.all_to_all_time(n, p, A, B)
    assert cm.all_to_all_time(n, 1, A, B) == 0.0
    with pytest.raises(ValueError, match="pairwise exchange"):
        cm.all_to_all_time(n, p, A, B, "tree")


# ---- simulated schedules: every message counted ---------------------------------------------

def _ring_schedule(n, block_bytes):
    """Ring attention on n ranks: forward passes K/V blocks n-1 hops; backward passes them
    again and carries each block's dK/dV accumulator n hops, home to its owner."""
    sent = {"forward": [0] * n, "backward": [0] * n}
    holds = list(range(n))                           # which K/V block each rank holds
    seen = [{r} for r in range(n)]
    for _ in range(n - 1):
        holds = [holds[(r - 1) % n] for r in range(n)]          # rank r receives from r-1
        for r in range(n):
            sent["forward"][r] += block_bytes
            seen[r].add(holds[r])
    assert all(s == set(range(n)) for s in seen)      # every query block met every K/V block
    grad_at = list(range(n))                          # where block b's dK/dV accumulator is
    for step in range(n):
        for r in range(n):
            sent["backward"][r] += block_bytes * (2 if step < n - 1 else 1)   # K,V + dK,dV
        grad_at = [(g + 1) % n for g in grad_at]
    assert grad_at == list(range(n))                  # n hops bring each dK/dV home
    return sent


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_kv_bytes_is_the_simulated_ring(n):
    s, b, kv, e = 96, 2, 24, 2
    block = 2 * (s // n) * b * kv * e                     # K and V of one rank's block
    sent = _ring_schedule(n, block)
    assert set(sent["forward"]) == {lc.ring_kv_bytes(s, b, 64, n, e, "forward", kv_hidden=kv)}
    assert set(sent["backward"]) == {lc.ring_kv_bytes(s, b, 64, n, e, "backward", kv_hidden=kv)}
    assert lc.ring_kv_bytes(s, b, kv, n, e) == sent["forward"][0] + sent["backward"][0]
    assert lc.ring_kv_bytes(s, b, kv, 1, e) == 0


def _all_to_all_sent(chunks):
    """Bytes each rank sends when rank r hands chunks[r][j] to rank j (its own stays)."""
    n = len(chunks)
    return [sum(chunks[r][j].nbytes for j in range(n) if j != r) for r in range(n)]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ulysses_bytes_is_the_simulated_all_to_all(n):
    """q, k, v leave as sequence shards (s/N, b, heads, d) split by heads; out returns."""
    s, b, heads, kv_heads, d = 64, 2, 8, 8, 4
    rng = np.random.default_rng(0)
    sent = [0] * n
    for width in (heads, kv_heads, kv_heads, heads):          # q, k, v, then out
        shards = [rng.standard_normal((s // n, b, width, d)).astype(np.float16) for _ in range(n)]
        chunks = [np.split(x, n, axis=2) for x in shards]
        got = [np.concatenate([chunks[src][r] for src in range(n)], axis=0) for r in range(n)]
        assert got[0].shape == (s, b, width // n, d)           # whole sequence, 1/N heads
        sent = [a + c for a, c in zip(sent, _all_to_all_sent(chunks))]
    assert set(sent) == {lc.ulysses_bytes(s, b, heads * d, n, 2, "forward")}
    assert lc.ulysses_bytes(s, b, heads * d, n, 2) == 2 * sent[0]


def test_ulysses_falls_as_one_over_n_while_the_ring_does_not():
    s, b, h = 2 ** 17, 1, 8192
    ring = [lc.ring_kv_bytes(s, b, h, n, phase="forward") for n in (2, 4, 8, 16, 32)]
    ulysses = [lc.ulysses_bytes(s, b, h, n, phase="forward") for n in (2, 4, 8, 16, 32)]
    assert ring == sorted(ring) and ring[-1] < 2 * s * b * h * 2       # -> 2 s b kv, from below
    assert ulysses == sorted(ulysses, reverse=True)
    assert ulysses[-1] * 32 / 31 * 32 == pytest.approx(4 * s * b * h * 2)    # (N-1)/N^2 x 4sbh


def test_with_gqa_the_ring_sends_less_up_to_eight_ranks():
    """Llama-3-70B (64 query heads, 8 KV heads of 128): ring / Ulysses = N/9 while N <= 8;
    beyond, Ulysses repeats KV heads and the ring sends more."""
    s, b, h, kv = 131072, 1, 8192, 1024
    for n in (2, 4, 8, 16, 32, 64):
        moved = lc.ulysses_kv_heads(64, 8, n) * 128
        ratio = (lc.ring_kv_bytes(s, b, h, n, 2, "forward", kv_hidden=kv)
                 / lc.ulysses_bytes(s, b, h, n, 2, "forward", kv_hidden=moved))
        if n <= 8:
            assert ratio == pytest.approx(n / 9)
        else:
            assert ratio > 1


def test_ulysses_needs_heads_divisible_and_repeats_kv_heads():
    assert lc.ulysses_kv_heads(64, 8, 8) == 8
    assert lc.ulysses_kv_heads(64, 8, 16) == 16          # each KV head sent twice
    assert lc.ulysses_kv_heads(64, None, 16) == 64
    with pytest.raises(ValueError, match="must divide num_heads=12.*or ring attention"):
        lc.ulysses_kv_heads(12, 4, 8)
    with pytest.raises(ValueError, match="pad the sequence"):
        lc.ulysses_bytes(100, 1, 64, 8)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_expert_all_to_all_bytes_is_the_simulated_dispatch(n):
    """Each rank routes its tokens to n ranks' experts, padded to capacity; combine sends the
    same slots back."""
    tokens, h, k, cf, experts = 64, 16, 2, 1.25, 2 * n
    cap = lc.expert_capacity(tokens, experts, k, cf)
    assert cap == math.ceil(1.25 * 64 * 2 / experts)
    slots = np.zeros((experts, cap, h), dtype=np.float16)     # one rank's dispatch buffer
    chunks = [np.split(slots, n) for _ in range(n)]            # experts 2r, 2r+1 live on rank r
    dispatch = _all_to_all_sent(chunks)
    assert set(dispatch) == {lc.expert_all_to_all_bytes(tokens, h, n, k, cf, 2, "forward") / 2}
    assert lc.expert_all_to_all_bytes(tokens, h, n, k, cf, 2) == 4 * dispatch[0]
    assert lc.expert_all_to_all_bytes(tokens, h, n, k, cf, 2, "backward", recompute=True) \
        == 4 * dispatch[0]
    assert lc.expert_all_to_all_bytes(tokens, h, 1, k, cf) == 0


# ---- sequence parallelism: TP's bytes, twice the calls; LN/dropout memory / t ----------------

@pytest.mark.parametrize("t", [2, 4, 8])
def test_sequence_parallel_moves_what_tensor_parallel_moves(t):
    s, b, h, e = 2048, 2, 1024, 2
    n = s * b * h * e
    allreduce_sent = 2 * (t - 1) / t * n                    # one ring all-reduce, per rank
    assert lc.sequence_parallel_bytes(s, b, h, t, e, "forward") == pytest.approx(
        2 * allreduce_sent)
    assert lc.sequence_parallel_bytes(s, b, h, t, e) == pytest.approx(4 * allreduce_sent)
    # on a ring a reduce-scatter + all-gather pair costs one all-reduce, latency included ...
    assert lc.sequence_parallel_time(s, b, h, t, A, B) == pytest.approx(
        4 * cm.allreduce_time(n, t, A, B), rel=1e-12)
    assert lc.sequence_parallel_time(s, b, h, t, A, B, recompute=True) == pytest.approx(
        6 * cm.allreduce_time(n, t, A, B), rel=1e-12)
    # ... each collective on its own (t-1) alpha terms
    assert lc.sequence_parallel_time(s, b, h, t, A, 0.0) == pytest.approx(4 * 2 * (t - 1) * A)
    # other algorithms differ: a tree moves more than a tree all-reduce's reduce + broadcast
    assert lc.sequence_parallel_time(s, b, h, t, A, B, algorithm="tree") != pytest.approx(
        4 * cm.allreduce_time(n, t, A, B, "tree"))


def test_sequence_parallel_memory_is_the_planners_formula():
    model = pl.Transformer(4, 1024, 16, seq_len=2048)
    layout = pl.Layout(tp=4, micro_batch=2)
    without, with_sp = lc.sequence_parallel_activations(model, layout)
    assert without == pm.layer_activation_bytes(model, layout, "none")
    s, b, h = 2048, 2, 1024
    assert without - with_sp == pytest.approx(10 * s * b * h * (1 - 1 / 4))   # LN/dropout / t
    full = lc.sequence_parallel_activations(model, layout, recompute=True)
    assert full == (2 * s * b * h, 2 * s * b * h / 4)
    assert pl._layer_activation_bytes is pm.layer_activation_bytes        # one formula


# ---- ring attention's overlap ------------------------------------------------------------------

def test_ring_overlap_hides_transfer_behind_block_compute():
    s, b, h, n = 2 ** 17, 1, 8192, 8
    # a slow GPU (1 TFLOP/s): every block's attention outlasts its message
    transfer, exposed = lc.ring_attention_time(s, b, h, n, A, B, 1e12, kv_hidden=1024)
    block = 2 * s // n * b * 1024 * 2
    kv, both = cm.send_recv_time(block, 2, A, B), cm.send_recv_time(2 * block, 2, A, B)
    # forward: N-1 K/V hops; backward: K/V alone (block 0), K/V + dK/dV (blocks 1..N-2),
    # dK/dV alone (block N-1), and the last dK/dV hop home
    assert transfer == pytest.approx((n - 1) * kv + kv + (n - 2) * both + kv + kv)
    assert exposed == pytest.approx(kv)                  # only the last dK/dV hop shows
    # a block's backward (2 fwd) outlasts one hop but not two at once: only blocks 1..N-2 and
    # the last hop show in backward (the schedule, not "every step carries both")
    fwd = 0.45 * both
    speed = 4 * (s // n) ** 2 * b * h / fwd
    _, mid = lc.ring_attention_time(s, b, h, n, A, B, speed, kv_hidden=1024)
    assert kv - fwd > 0 and kv - 2 * fwd < 0 < both - 2 * fwd
    assert mid == pytest.approx((n - 1) * (kv - fwd) + (n - 2) * (both - 2 * fwd) + kv)
    fast = lc.ring_attention_time(s, b, h, n, A, B, 1e30, kv_hidden=1024)
    assert fast[1] == pytest.approx(fast[0])             # nothing to hide behind: all exposed
    assert lc.ring_attention_time(s, b, h, 1, A, B, 1.0) == (0.0, 0.0)
    recomputed = lc.ring_attention_time(s, b, h, n, A, B, 1e12, kv_hidden=1024, recompute=True)
    assert recomputed[0] == pytest.approx(transfer + (n - 1) * kv)


# ---- the planner: new layouts, new terms, old results kept ----------------------------------

LLAMA70 = pl.Transformer(80, 8192, 64, seq_len=131072, vocab=128256, ffn_hidden=28672,
                         num_kv_heads=8, tied_embeddings=False, gated_mlp=True)
MIXTRAL = pl.Transformer(32, 4096, 32, seq_len=4096, vocab=32000, ffn_hidden=14336,
                         num_kv_heads=8, tied_embeddings=False, gated_mlp=True, num_experts=8,
                         top_k=2, capacity_factor=1.25)


def test_context_parallel_terms_are_long_contexts():
    hw = pl.HARDWARE["H100-80GB"]
    speed = hw.peak_flops * hw.efficiency
    for algo in ("ring", "ulysses"):
        layout = pl.Layout(dp=1, tp=8, pp=4, sequence_parallel=True, context_parallel=8,
                           context_algorithm=algo)
        pred = pl.predict(LLAMA70, layout, 4, hw, recompute="selective")
        if algo == "ring":
            per_layer = lc.ring_attention_time(131072, 1, 1024, 8, hw.inter.alpha, hw.inter.beta,
                                               speed, kv_hidden=128)[1]
        else:
            per_layer = lc.ulysses_time(131072, 1, 1024, 8, hw.inter.alpha, hw.inter.beta,
                                        kv_hidden=8 * 128)      # 1 KV head per TP rank -> 8
        m = 4
        assert pred.terms["context parallel"] == pytest.approx(m * 20 * per_layer)
        assert sum(pred.terms.values()) == pytest.approx(pred.step.total, rel=1e-12)


def test_sequence_parallel_term_is_the_all_reduce_term_on_a_ring():
    model = pl.Transformer(24, 4096, 32, seq_len=8192)
    plain = pl.predict(model, pl.Layout(tp=8), 4, "H100-80GB")
    sp = pl.predict(model, pl.Layout(tp=8, sequence_parallel=True), 4, "H100-80GB")
    assert sp.terms["tensor parallel"] == pytest.approx(plain.terms["tensor parallel"], rel=1e-12)
    assert sp.memory < plain.memory


def test_moe_counts_are_what_pytorch_counts():
    """A Mixtral-like MoE layer's MLP built with torch.nn: parameters counted, FLOPs counted
    by FlopCounterMode with every token routed to top_k experts."""
    from torch.utils.flop_counter import FlopCounterMode
    cfg = pl.Transformer(1, 32, 4, seq_len=16, vocab=11, ffn_hidden=48, gated_mlp=True,
                         num_experts=4, top_k=2)
    dense = dataclasses.replace(cfg, num_experts=1, top_k=1)
    h, f = cfg.hidden, cfg.ffn
    experts = nn.ModuleList(nn.ModuleDict({"gate": nn.Linear(h, f), "up": nn.Linear(h, f),
                                                "down": nn.Linear(f, h)}) for _ in range(4))
    router = nn.Linear(h, 4, bias=False)
    one = sum(p.numel() for p in experts[0].parameters())
    assert cfg.layer_params - dense.layer_params == sum(
        p.numel() for p in experts.parameters()) + h * 4 - one
    assert cfg.expert_params == sum(p.numel() for p in experts.parameters())
    x = torch.randn(40, h)
    with FlopCounterMode(display=False) as counted:
        top = router(x).topk(2, dim=-1).indices                 # (tokens, k)
        for e, ex in enumerate(experts):
            rows = x[(top == e).any(-1)]
            ex["down"](F.silu(ex["gate"](rows)) * ex["up"](rows))
    attention = dense.layer_flops(40) - 3 * 2 * 40 * h * f
    assert cfg.layer_flops(40) - attention == counted.get_total_flops()


def test_expert_parallelism_shards_experts_and_adds_its_all_to_alls():
    hw = pl.HARDWARE["H100-80GB"]
    base = pl.Layout(dp=8, tp=2, pp=1, sequence_parallel=True, zero=1)
    one = pl.predict(MIXTRAL, base, 64, hw, recompute="selective")
    ep = pl.predict(MIXTRAL, dataclasses.replace(base, expert_parallel=8), 64, hw,
                    recompute="selective")
    assert one.terms["expert parallel"] == 0.0
    m = 64 // 8
    link = hw.inter                               # tp x ep = 16 GPUs: two nodes
    per_layer = lc.expert_all_to_all_time(4096 / 2, 4096, 8, link.alpha, link.beta, 2, 1.25)
    assert ep.terms["expert parallel"] == pytest.approx(m * 32 * per_layer)
    assert sum(ep.terms.values()) == pytest.approx(ep.step.total, rel=1e-12)
    # the experts' model states are split 8 more ways: 16 bytes each, ZeRO-1 over 8 / 8 ranks
    experts = 32 * MIXTRAL.expert_params / 2
    saved = (pl.zero_memory_per_gpu(experts, 8, 1) - pl.zero_memory_per_gpu(experts / 8, 1, 1))
    assert one.memory - ep.memory == pytest.approx(saved)


def test_new_layouts_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="set tp > 1, or sequence_parallel=False"):
        pl.predict(LLAMA70, pl.Layout(dp=1, sequence_parallel=True), 1, "H100-80GB", 0.5)
    with pytest.raises(ValueError, match="or ring attention"):
        pl.predict(LLAMA70, pl.Layout(tp=8, context_parallel=16, context_algorithm="ulysses"),
                   1, "H100-80GB", 0.5)
    with pytest.raises(ValueError, match="'ring' or 'ulysses'"):
        pl.predict(LLAMA70, pl.Layout(context_parallel=2, context_algorithm="tree"), 1,
                   "H100-80GB", 0.5)
    with pytest.raises(ValueError, match="num_experts=...\\)\\) and must be >= 1"):
        pl.predict(LLAMA70, pl.Layout(dp=8, expert_parallel=8), 8, "H100-80GB", 0.5)
    with pytest.raises(ValueError, match="must divide num_experts=8 and dp x context_parallel"):
        pl.predict(MIXTRAL, pl.Layout(dp=4, expert_parallel=8), 8, "H100-80GB", 0.5)
    with pytest.raises(ValueError, match="must divide num_experts=8"):
        pl.predict(MIXTRAL, pl.Layout(dp=6, expert_parallel=3), 6, "H100-80GB", 0.5)


def test_search_tries_expert_parallel_degrees_when_asked():
    found = pl.search(MIXTRAL, 64, 64, "H100-80GB", recompute="selective", top=200,
                      zero_stages=(1,), micro_batches=(1,), virtual_stages=(1,),
                      expert_parallel=(1, 8))
    assert {p.layout.ep for p in found} == {1, 8}
    assert all(p.layout.world_size == 64 for p in found)
