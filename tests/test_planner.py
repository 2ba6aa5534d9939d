"""Tests of labutils.cost.planner (and planspec, published): ZeRO memory, exact parameter and FLOP
counts against an instantiated model, the pipeline bubble, today's layouts, published rows."""
import csv
import dataclasses
import math
import os

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import labutils as lu
from labutils import planner as pl
from labutils import published as pub

from labutils.exercises import lab07

from .checkers import assert_check, checker_cases

pytestmark = pytest.mark.lab07


def test_zero_paper_example_exact():
    """Rajbhandari et al. 2020, Figure 1: 7.5 B parameters, Nd = 64 -> 120, 31.4, 16.6, 1.9 GB."""
    with open(os.path.join(pub.DATA, "rajbhandari2020_zero_example.csv")) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    got = [round(pl.zero_memory_per_gpu(7.5e9, 64, stage) / 1e9, 1) for stage in range(4)]
    assert got == [120.0, 31.4, 16.6, 1.9]
    assert got == [float(r["gigabytes_per_gpu"]) for r in rows]
    assert pl.zero_memory_per_gpu(7.5e9, 1, 3) == 16 * 7.5e9  # one rank: nothing to shard
    with pytest.raises(ValueError, match="stage"):
        pl.zero_memory_per_gpu(1e9, 8, 4)


# ---- the model's counts, against a model built from them ----------------------------------

class _Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, f, kv = cfg.hidden, cfg.ffn, cfg.kv_hidden
        self.cfg = cfg
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, h + 2 * kv), nn.Linear(h, h)
        if cfg.gated_mlp:
            self.gate, self.up, self.down = nn.Linear(h, f), nn.Linear(h, f), nn.Linear(f, h)
        else:
            self.fc, self.out = nn.Linear(h, f), nn.Linear(f, h)

    def forward(self, x):
        cfg = self.cfg
        B, s, h = x.shape
        a, kvh = cfg.num_heads, cfg.num_kv_heads or cfg.num_heads
        d = h // a
        q, k, v = self.qkv(self.ln1(x)).split([h, cfg.kv_hidden, cfg.kv_hidden], -1)
        q = q.view(B, s, a, d).transpose(1, 2)
        k, v = (t.view(B, s, kvh, d).transpose(1, 2).repeat_interleave(a // kvh, dim=1)
                for t in (k, v))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, s, h)
        x = x + self.proj(y)
        z = self.ln2(x)
        z = (self.down(F.silu(self.gate(z)) * self.up(z)) if cfg.gated_mlp
             else self.out(F.gelu(self.fc(z))))
        return x + z


class _GPT(nn.Module):
    """The architecture planspec.Transformer describes, built with torch.nn."""

    def __init__(self, cfg):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(cfg.vocab, cfg.hidden), nn.Embedding(cfg.seq_len,
                                                                                cfg.hidden)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.head = None if cfg.tied_embeddings else nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return F.linear(x, self.wte.weight) if self.head is None else self.head(x)


CONFIGS = [
    pl.Transformer(2, 32, 4, seq_len=16, vocab=50),
    pl.Transformer(3, 48, 6, seq_len=12, vocab=37, ffn_hidden=80, num_kv_heads=2,
                   tied_embeddings=False, gated_mlp=True),                       # Llama-like
    pl.Transformer(2, 64, 8, seq_len=8, vocab=29, num_kv_heads=1, gated_mlp=True),  # MQA
    pl.Transformer(1, 24, 3, seq_len=10, vocab=11, ffn_hidden=40, tied_embeddings=False),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"h{c.hidden}kv{c.num_kv_heads}")
def test_parameter_count_is_exact(cfg):
    model = _GPT(cfg)
    assert cfg.num_params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"h{c.hidden}kv{c.num_kv_heads}")
def test_flop_count_is_what_pytorch_counts(cfg):
    """FlopCounterMode counts every matmul of forward and backward: the model FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode
    torch.manual_seed(0)
    model, batch = _GPT(cfg), 3
    idx = torch.randint(cfg.vocab, (batch, cfg.seq_len))
    with FlopCounterMode(display=False) as forward_only:
        model(idx)
    with FlopCounterMode(display=False) as both:
        F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
    assert cfg.iteration_flops(batch, "none") == both.get_total_flops()
    assert cfg.iteration_flops(batch, recompute=False) == both.get_total_flops()
    # a full recomputation runs the layers' forward once more
    layers = forward_only.get_total_flops() - cfg.logits_flops(batch * cfg.seq_len)
    assert cfg.iteration_flops(batch, "full") == both.get_total_flops() + layers


def test_gpt_flops_are_narayanan_eq3():
    m = pl.Transformer(num_layers=2, hidden=64, num_heads=4, seq_len=32, vocab=100)
    B, s, l, h, V = 4, 32, 2, 64, 100
    assert m.iteration_flops(B) == pytest.approx(96 * B * s * l * h * h
                                                 * (1 + s / (6 * h) + V / (16 * l * h)), rel=1e-12)
    assert m.iteration_flops(B, recompute=False) == pytest.approx(
        72 * B * s * l * h * h * (1 + s / (6 * h)) + 6 * B * s * h * V, rel=1e-12)


def test_parameter_count_matches_the_published_sizes():
    for row in pub.narayanan2021():  # eq. 2 vs the table's parameter column: within 3%
        assert row["model"].num_params / 1e9 == pytest.approx(row["params_billion"], rel=0.03)
        gpus = row["layout"].world_size
        assert gpus * row["tflops_per_gpu"] / 1e3 == pytest.approx(row["aggregate_pflops"],
                                                                   rel=0.01)
    for row in pub.shoeybi2019():
        assert row["model"].num_params / 1e9 == pytest.approx(row["params_billion"], rel=0.05)


# ---- the pipeline bubble --------------------------------------------------------------------

@pytest.mark.parametrize("p, m, v", [(2, 4, 1), (4, 8, 1), (8, 16, 1), (4, 8, 2), (8, 16, 4),
                                     (3, 6, 1)])
def test_bubble_share_is_the_formula(p, m, v):
    """Non-interleaved 1F1B idles (p-1)/(m+p-1) of the pipeline; with v virtual stages per
    rank each fill/drain slot is 1/v as long: (p-1)/(v m + p - 1)."""
    model = pl.Transformer(96, 1024, 16)
    layout = pl.Layout(dp=2, tp=2, pp=p, virtual_stages=v, micro_batch=1)
    pred = pl.predict(model, layout, 2 * m, "A100-80GB", 0.5)
    assert abs(pred.bubble_fraction - (p - 1) / (v * m + p - 1)) < 1e-9
    s = pred.step
    busy = s.total - pred.terms["data parallel"]   # the pipeline's own time
    assert abs(s.bubble / busy - (p - 1) / (v * m + p - 1)) < 1e-9
    assert s.total == pytest.approx(s.compute + s.exposed_comm + s.bubble, rel=1e-12)


def test_step_terms_add_up():
    m = pl.Transformer(48, 8192, 64)
    pred = pl.predict(m, pl.Layout(dp=32, tp=8, pp=2), 1536, "A100-80GB", 0.5)
    assert sum(pred.terms.values()) == pytest.approx(pred.step.total, rel=1e-12)


# ---- today's layouts ------------------------------------------------------------------------

def test_zero3_gathers_weights_for_every_micro_batch():
    model = pl.Transformer(24, 2048, 16)
    comm = {}
    for zero in (1, 3):
        for mb in (1, 4):   # 16 or 4 micro-batches per step, same batch
            pred = pl.predict(model, pl.Layout(dp=8, zero=zero, micro_batch=mb), 128,
                              "A100-80GB", 0.5)
            comm[zero, mb] = pred.step.comm
    assert comm[1, 1] == pytest.approx(comm[1, 4])          # one all-reduce per step
    assert comm[3, 1] > 3 * comm[3, 4]                       # 16 gathers vs 4


def test_unequal_stages_and_the_slowest_one_sets_the_pace():
    model = pl.Transformer(24, 2048, 16)
    assert pl.Layout(pp=5).layers_per_stage(24) == (5, 5, 5, 5, 4)
    pl.predict(model, pl.Layout(dp=1, pp=5), 10, "A100-80GB", 0.5)     # pp need not divide
    even = pl.predict(model, pl.Layout(pp=4, stage_layers=(6, 6, 6, 6)), 8, "A100-80GB", 0.5)
    skewed = pl.predict(model, pl.Layout(pp=4, stage_layers=(9, 5, 5, 5)), 8, "A100-80GB", 0.5)
    assert skewed.step.total > even.step.total
    with pytest.raises(ValueError, match="summing to num_layers"):
        pl.predict(model, pl.Layout(pp=4, stage_layers=(6, 6, 6, 5)), 8, "A100-80GB", 0.5)


def test_memory_terms():
    model = pl.Transformer(8, 1024, 16, seq_len=1024, vocab=32000)
    base = pl.Layout(dp=1, tp=4, pp=2)
    plain = pl.memory_per_gpu(model, base, recompute="none")
    sp = pl.memory_per_gpu(model, pl.Layout(dp=1, tp=4, pp=2, sequence_parallel=True),
                           recompute="none")
    selective = pl.memory_per_gpu(model, base, recompute="selective")
    full = pl.memory_per_gpu(model, base, recompute="full")
    assert full < selective < plain and sp < plain
    # sequence parallelism splits the 10 sbh outside the TP region: exactly 3/4 of it saved
    # per layer and micro-batch in flight on the first rank (4 layers, 2 micro-batches), plus
    # the embedding's dropout mask
    s, b, h = 1024, 1, 1024
    assert plain - sp == pytest.approx(4 * 2 * 10 * s * b * h * 3 / 4 + 2 * s * b * h * 3 / 4)
    # the first rank holds the embedding: more than the second's layers alone
    states = pl.zero_memory_per_gpu((4 * model.layer_params + model.embedding_params) / 4, 1, 0)
    assert plain > states


def test_context_parallel_and_interleaving():
    model = pl.Transformer(32, 4096, 32, seq_len=32768)
    one = pl.predict(model, pl.Layout(dp=1, tp=8, pp=4), 16, "H100-80GB", recompute="selective")
    cp = pl.predict(model, pl.Layout(dp=1, tp=8, pp=4, context_parallel=2), 16, "H100-80GB",
                    recompute="selective")
    assert cp.memory < one.memory
    assert cp.terms["context parallel"] >= 0
    inter = pl.predict(model, pl.Layout(dp=1, tp=8, pp=4, virtual_stages=2), 16, "H100-80GB",
                       recompute="selective")
    assert inter.bubble_fraction < one.bubble_fraction
    assert inter.terms["pipeline messages"] == pytest.approx(2 * one.terms["pipeline messages"])


def test_recompute_modes_and_flop_conventions():
    model = pl.Transformer(24, 2048, 16)
    layout = pl.Layout(dp=8)
    full = pl.predict(model, layout, 64, "A100-80GB")               # default efficiency
    assert full.recompute == "full"
    assert pl.predict(model, layout, 64, "A100-80GB", recompute=False).recompute == "none"
    none = pl.predict(model, layout, 64, "A100-80GB", recompute="none")
    selective = pl.predict(model, layout, 64, "A100-80GB", recompute="selective")
    assert none.flops_per_gpu == none.hardware_flops_per_gpu
    assert full.hardware_flops_per_gpu / full.flops_per_gpu == pytest.approx(
        model.iteration_flops(64, "full") / model.iteration_flops(64, "none"))
    assert none.step.total < selective.step.total < full.step.total
    with pytest.raises(ValueError, match="recompute"):
        pl.predict(model, layout, 64, "A100-80GB", recompute="some")


def test_calibrate_inverts_predict():
    m = pl.Transformer(24, 2304, 24)
    layout = pl.Layout(dp=4, tp=2, pp=2)
    for convention, attr in (("model", "flops_per_gpu"), ("hardware", "hardware_flops_per_gpu")):
        eff = pl.calibrate(m, layout, 64, "A100-80GB", 120e12, convention=convention)
        pred = pl.predict(m, layout, 64, "A100-80GB", eff)
        assert getattr(pred, attr) == pytest.approx(120e12, rel=1e-6)
    with pytest.raises(ValueError, match="100% of peak"):
        pl.calibrate(m, layout, 64, "A100-80GB", 400e12)


def test_bad_layouts_are_refused_with_the_fix():
    m = pl.Transformer(24, 2304, 24)
    with pytest.raises(ValueError, match="pp <= num_layers"):
        pl.predict(m, pl.Layout(dp=1, pp=25), 25, "A100-80GB", 0.5)
    with pytest.raises(ValueError, match="multiple of dp x micro_batch"):
        pl.predict(m, pl.Layout(dp=3), 8, "A100-80GB", 0.5)
    with pytest.raises(ValueError, match="must divide num_heads"):
        pl.predict(m, pl.Layout(tp=5), 8, "A100-80GB", 0.5)
    with pytest.raises(ValueError, match="multiple of pp"):
        pl.predict(m, pl.Layout(pp=4, virtual_stages=2), 6, "A100-80GB", 0.5)
    with pytest.raises(ValueError, match="unknown hardware"):
        pl.predict(m, pl.Layout(), 8, "TPU", 0.5)


def test_search_ranks_feasible_layouts_and_needs_model_parallelism_for_big_models():
    small = pl.search(pl.Transformer(24, 2304, 24), 64, 512, "A100-80GB", 0.5)
    assert small and all(p.memory <= 80e9 for p in small)
    assert [p.flops_per_gpu for p in small] == sorted((p.flops_per_gpu for p in small),
                                                      reverse=True)
    assert small[0].layout.tp == 1 and small[0].layout.pp == 1  # fits: plain DP is fastest
    big = pl.search(pl.Transformer(96, 16384, 128), 1024, 2048, "A100-80GB", 0.5, top=40)
    assert big and all(p.layout.tp * p.layout.pp > 1 or p.layout.zero == 3 for p in big)
    assert all(p.layout.world_size == 1024 for p in big)
    assert {p.recompute for p in big} - {"full"}     # recomputation is chosen, not fixed


def test_search_takes_any_tp_that_divides_the_heads():
    model = pl.Transformer(12, 1536, 12, num_kv_heads=6)   # 12 heads, 6 KV heads: tp 1, 2, 3, 6
    found = pl.search(model, 6, 6, "A100-80GB", 0.5, top=1000, recompute="full",
                      zero_stages=(0,), micro_batches=(1,))
    assert {p.layout.tp for p in found} == {1, 2, 3, 6}


# ---- published runs -------------------------------------------------------------------------

def test_default_efficiencies_are_the_documented_fits():
    """Each fitted constant is re-derived from the rows FITS names: the A100's three from
    Narayanan et al.'s ten rows, the H100's efficiency from Llama 3's 8,192-GPU row."""
    assert set(pub.FITS) == {"A100-80GB", "H100-80GB", "V100-DGX-2H"}
    eff, half_width, link = pub.fit_gemm("A100-80GB")
    a100 = pl.HARDWARE["A100-80GB"]
    assert eff == pytest.approx(a100.efficiency, abs=1e-4)
    assert half_width == pytest.approx(a100.gemm_half_width, abs=1.0)
    assert link == pytest.approx(a100.link_efficiency, abs=1e-3)
    for name in ("H100-80GB", "V100-DGX-2H"):
        assert pub.fitted_efficiency(name) == pytest.approx(pl.HARDWARE[name].efficiency,
                                                            abs=1e-4), name


def test_narayanan_held_out_rows_beat_a_constant():
    """Calibrated on the 145.6 B row only: on the other nine rows the planner's mean absolute
    error is below that of predicting 148 TFLOP/s (the fitted row's value) for every row."""
    rows = pub.compare_narayanan(calibrate_on=6)
    assert rows[6]["fitted"] and rows[6]["error"] == pytest.approx(0.0, abs=1e-6)
    held = [r for r in rows if not r["fitted"]]
    errors = np.array([abs(r["error"]) for r in held])
    constant = np.array([abs(rows[6]["published"] / r["published"] - 1) for r in held])
    assert errors.mean() < constant.mean()
    assert np.all(errors < 0.15)


def test_shoeybi_weak_scaling_beats_perfect_scaling():
    """Weak-scaling efficiency, calibrated on the 1-GPU baseline: closer to Figure 5 than the
    'no loss' prediction (efficiency 1 everywhere), and falling with model parallelism."""
    rows = pub.compare_shoeybi()
    errors = np.array([abs(r["error"]) for r in rows])
    perfect = np.array([abs(1 - r["published"]) for r in rows])
    assert errors.mean() < perfect.mean() / 2
    predicted = [r["predicted"] for r in rows if r["layout"].dp == 1]
    assert predicted == sorted(predicted, reverse=True)  # more model parallelism, less efficient


def test_costmodel_bubble_formula_is_the_same():
    assert lu.step_time.bubble_fraction(4, 8) == pytest.approx(3 / 11)


# ---- exercise checkers (pure arithmetic: no processes) --------------------------------------

def _half_an_allreduce(n, d, zero):            # or 2-byte gradients
    return 4 * (d - 1) / d * n


def _zero1_gathers_fp32(n, d, zero):
    return 8 * (d - 1) / d * n


def _whole_buffer(n, d, zero):
    return lab07.dp_bytes_per_gpu(n, d, zero) * d / (d - 1)


def _all_gpus(n, d, zero):
    return lab07.dp_bytes_per_gpu(n, d, zero) * d


def _dp_stub(n, d, zero):
    raise NotImplementedError  # FILL ME IN


@pytest.mark.parametrize("answer, verdict", checker_cases(lab07.dp_bytes_per_gpu, {
    "half_an_allreduce": (_half_an_allreduce, ("expected", "fp32 main gradients of 4 bytes")),
    "zero1_gathers_fp32": (_zero1_gathers_fp32, ("zero=1", "bf16 weights (2 bytes each)")),
    "whole_buffer": (_whole_buffer, "(dp-1)/dp of the buffer"),
    "all_gpus": (_all_gpus, "the bytes one GPU sends"),
    "stub": (_dp_stub, "not implemented yet"),
}, passes="6 cases passed"))
def test_dp_bytes_checker_accepts_reference_and_names_typical_mistakes(answer, verdict):
    assert_check(lu.check_dp_bytes_per_gpu, answer, verdict)


def _ignores_v(p, v, share):
    m = p if v > 1 else 1
    while (p - 1) / (m + p - 1) > share:
        m += p if v > 1 else 1
    return m


def _any_m(p, v, share):
    m = 1
    while (p - 1) / (v * m + p - 1) > share:
        m += 1
    return m


def _one_short(p, v, share):
    return lab07.fewest_micro_batches(p, v, share) - (p if v > 1 else 1)


@pytest.mark.parametrize("answer, verdict", checker_cases(lab07.fewest_micro_batches, {
    "ignores_v": (_ignores_v, ("p=8, v=2", "last 1/v as long")),
    "any_m": (_any_m, "a multiple of p"),
    "one_short": (_one_short, "still leaves a bubble above the target"),
    "closed_form_wrong": (lambda p, v, s: 3, ("expected", "round up")),
}, passes="6 cases passed", also_right={"closed_form": lambda p, v, s: (
    -(-math.ceil((p - 1) * (1 / s - 1) / v) // p) * p if v > 1
    else math.ceil((p - 1) * (1 / s - 1) / v))}))
def test_micro_batch_checker_accepts_reference_and_names_typical_mistakes(answer, verdict):
    assert_check(lu.check_fewest_micro_batches, answer, verdict)


def test_the_exercise_references_agree_with_the_planner():
    """Exercise 1's bytes are what the planner's data-parallel term moves (ring collectives);
    exercise 2's m gives the planner's bubble share at most the target."""
    model = pl.Transformer(8, 1024, 16, seq_len=1024)
    psi = pl.stage_params(model, pl.Layout(dp=8), (8,))[0]
    link = pl.cm.Link("test", 1e9, 0.0)
    hw = dataclasses.replace(pl.HARDWARE["A100-80GB"], intra=link)
    for zero in (0, 1):
        t = pl.predict(model, pl.Layout(dp=8, zero=zero, grad_bytes=4), 64, hw, 0.5,
                       "full").terms["data parallel"]
        assert t == pytest.approx(lab07.dp_bytes_per_gpu(psi, 8, zero) / 1e9)
    for p, v, share in lab07._MB_CASES:
        m = lab07.fewest_micro_batches(p, v, share)
        layout = pl.Layout(pp=p, virtual_stages=v)
        pred = pl.predict(pl.Transformer(2 * p * v, 256, 4, seq_len=128), layout, m, hw, 0.5,
                          "full")
        assert pred.bubble_fraction <= share + 1e-9


def test_held_out_baseline_is_one_hardware_flop_rate_in_each_rows_convention():
    """The 2022-2024 baseline runs every job at its GPU's rate from the planner's own fitting
    rows; an MFU row sees it through its own recomputation (model / hardware FLOPs)."""
    rates = pub.baseline_rates()
    assert rates["A100-80GB"] == pytest.approx(
        np.mean([r["tflops_per_gpu"] for r in pub.narayanan2021()]) * 1e12 / 312e12)
    rows = pub.validate()
    assert len(rows) == 27 and all(r["source"] for r in rows)
    assert [r["num_gpus"] for r in rows if r["fitted"]] == [pub.H100_FIT_GPUS]
    for r in rows:
        m = r["model"]
        ratio = m.iteration_flops(1, "none") / m.iteration_flops(1, r["recompute"])
        rate = rates[r["hardware"]]
        expected = rate * ratio if r["metric"] == "model" else rate
        assert r["constant"] == pytest.approx(expected, rel=1e-12)
        assert r["error"] == pytest.approx(r["predicted"] / r["published"] - 1, rel=1e-12)
    llama = [r for r in rows if "Llama" in r["name"]]
    assert llama and all(not r["model"].tied_embeddings and r["model"].gated_mlp for r in llama)


# ---- issue 30: the search, the sources as printed, memory, errors that tell the truth -------

def test_a_tp_group_that_does_not_divide_a_node_is_priced_at_the_network():
    hw = pl.HARDWARE["A100-80GB"]
    assert [pl._link(hw, t) is hw.intra for t in (1, 2, 4, 8, 3, 6, 16)] == [True] * 4 + [False] * 3
    model = pl.Transformer(12, 1536, 12, num_kv_heads=6)   # tp 1, 2, 3, 6 divide the heads
    found = pl.search(model, 24, 24, hw, 0.5, top=1000, recompute="full", zero_stages=(0,),
                      micro_batches=(1,), virtual_stages=(1,))
    assert {p.layout.tp for p in found} == {1, 2, 3, 6}
    network = dataclasses.replace(hw, intra=hw.inter)      # every link the network's
    for p in found:
        if p.layout.tp in (3, 6):
            slow = pl.predict(model, p.layout, 24, network, 0.5, "full").terms
            assert p.terms["tensor parallel"] == pytest.approx(slow["tensor parallel"])


def test_search_never_prices_a_cross_node_tp_group_at_nvlink_speed():
    """The 145.6 B model on 1,536 A100s: every TP group the search prices at NVLink speed lies
    inside one node; a 6-wide group (96 heads allow it) pays the network."""
    hw = pl.HARDWARE["A100-80GB"]
    model = pub.narayanan2021()[6]["model"]
    found = pl.search(model, 1536, 2304, hw, recompute="full", top=200, zero_stages=(0, 1),
                      micro_batches=(1,), virtual_stages=(1, 2), sequence_parallel=(False,))
    assert found and {p.layout.tp for p in found} >= {8}
    network = dataclasses.replace(hw, intra=hw.inter)
    for p in found:
        if hw.gpus_per_node % p.layout.tp:
            slow = pl.predict(model, p.layout, 2304, network, recompute="full").terms
            assert p.terms["tensor parallel"] == pytest.approx(slow["tensor parallel"])
    assert hw.gpus_per_node % found[0].layout.tp == 0
    assert all(p.fits and p.memory <= pl.usable_memory(hw) < hw.memory for p in found)


def test_memory_counts_megatron_fp32_gradients_and_a_reserve():
    """18 bytes per parameter without sharding, 6 + 12/d with the distributed optimizer
    (zero=1); 16 and 4 + 12/d with fp16 gradients (grad_bytes=2, the ZeRO paper's)."""
    model = pl.Transformer(8, 1024, 16, seq_len=1024)
    psi = pl.stage_params(model, pl.Layout(dp=8), (8,))[0]
    mem = {(z, g): pl.memory_per_gpu(model, pl.Layout(dp=8, zero=z, grad_bytes=g), "full")
           for z in (0, 1) for g in (2, 4)}
    assert mem[0, 4] - mem[0, 2] == pytest.approx(2 * psi)
    assert mem[0, 4] - mem[1, 4] == pytest.approx(12 * psi * (1 - 1 / 8))
    acts = mem[0, 4] - 18 * psi
    assert mem[1, 4] == pytest.approx((6 + 12 / 8) * psi + acts)
    assert pl.usable_memory(pl.HARDWARE["H100-80GB"]) == pytest.approx(80e9 * 0.92 - 2e9)


def test_flash_attention_stores_no_scores():
    model = pl.Transformer(8, 1024, 16, seq_len=4096)
    plain, flash = pl.Layout(tp=2), pl.Layout(tp=2, flash_attention=True)
    assert (pl.layer_activation_bytes(model, flash, "none")
            == pl.layer_activation_bytes(model, plain, "selective"))
    s, a, t = 4096, 16, 2
    assert (pl.layer_activation_bytes(model, plain, "none")
            - pl.layer_activation_bytes(model, flash, "none")) == pytest.approx(5 * a * s * s / t)
    slow = pl.predict(model, plain, 8, "H100-80GB", recompute="selective")
    fast = pl.predict(model, flash, 8, "H100-80GB", recompute="selective")
    assert fast.terms["memory-bound ops"] < slow.terms["memory-bound ops"]
    assert fast.terms["compute"] == pytest.approx(slow.terms["compute"])


def test_zero1_gradients_hide_only_behind_the_last_backward():
    model = pl.Transformer(24, 2048, 16)
    for zero in (0, 2):
        layout = pl.Layout(dp=64, zero=zero)
        pred = pl.predict(model, layout, 64 * 8, "A100-80GB", 0.5, "none", dp_overlap=1.0)
        exposed = pl.predict(model, layout, 64 * 8, "A100-80GB", 0.5, "none").terms
        m = 8
        work = pred.terms["compute"] + pred.terms["memory-bound ops"]
        window = work if zero else work / m
        assert pred.terms["data parallel"] == pytest.approx(
            max(0.0, exposed["data parallel"] - 2 / 3 * window))


def test_sources_are_encoded_as_printed():
    """Narayanan et al. interleaved (Sec. 5.1); MT-NLG and BLOOM predate sequence parallelism;
    Llama 3: lighter first and last stages, one layer per chunk, FSDP sharding gradients
    (ZeRO-2) and overlapped, FlashAttention, no dropout; TP overlap only in the 2022+ Megatron-LM
    rows."""
    for r in pub.narayanan2021():
        L = r["layout"]
        assert (L.virtual_stages > 1) == (L.pp > 1) and not L.sequence_parallel
        assert all(n % L.virtual_stages == 0 for n in L.layers_per_stage(r["model"].num_layers))
    rows = pub.runs_2022_2024()
    for r in rows:
        if r["source"].startswith(("smith2022", "bigscience2022")):
            assert not r["layout"].sequence_parallel, r["name"]
    llama = [r for r in rows if "llama3" in r["source"]]
    assert len(llama) == 2
    for r in llama:
        L = r["layout"]
        assert L.layers_per_stage(126) == (7,) + (8,) * 14 + (7,)
        assert L.virtual_stages == 8 and L.flash_attention and L.zero == 2
        assert not r["model"].dropout and r["dp_overlap"] == 1.0 and not L.tp_overlap
    assert all(r["layout"].grad_bytes == 4 for r in rows + pub.narayanan2021())
    for r in rows:
        assert r["layout"].tp_overlap == r["source"].startswith(("korthikanti2022", "jiang2024"))
        assert r["model"].dropout or "llama3" in r["source"]
    assert not any(r["layout"].tp_overlap for r in pub.narayanan2021())


def test_every_published_layout_is_checked_against_memory():
    """validate() reports whether each layout fits the GPU's usable memory: every row but
    Llama 3's does. Llama 3's interleaved layout does not under Megatron-LM's in-flight count
    (the planner's memory model); plain 1F1B (v = 1) would."""
    rows = pub.validate()
    assert all(r["fits"] == (r["memory"] <= pl.usable_memory(pl.get_hardware(r["hardware"])))
               for r in rows)
    assert {r["name"] for r in rows if not r["fits"]} == {"Llama-3-405B"}
    for r in pub.narayanan2021():
        assert pl.predict(r["model"], r["layout"], r["batch_size"], r["hardware"],
                          recompute="full").fits, r["name"]
    r = pub.h100_fit_row()
    plain = dataclasses.replace(r["layout"], virtual_stages=1)
    assert pl.memory_per_gpu(r["model"], plain, "selective", batch_size=r["batch_size"]) <= \
        pl.usable_memory(pl.HARDWARE["H100-80GB"])


def test_interleaved_memory_is_megatrons_warm_up_count():
    """Rank i of an interleaved pipeline runs 2 (p - i - 1) + (v - 1) p chunk forwards before its
    first backward and holds one more (all m v of them if there are no more)."""
    model = pl.Transformer(32, 1024, 16, seq_len=1024)
    p, v, m = 4, 2, 8
    layout = pl.Layout(pp=p, virtual_stages=v)
    per_layer = pl.layer_activation_bytes(model, layout, "none")
    stages = layout.layers_per_stage(32)
    mem = pl.memory_per_stage(model, layout, "none", stages, m)
    for i in (1, 2):   # middle ranks: no embedding, no logits; layers 8 each
        chunks = min(m * v, 2 * (p - i - 1) + (v - 1) * p + 1)
        states = mem[i] - 8 * per_layer * chunks / v
        assert states == pytest.approx(pl.zero_memory_per_gpu(
            pl.stage_params(model, layout, stages)[i], 1, 0))


def test_data_parallel_traffic_moves_the_gradients_at_their_own_bytes():
    """fp32 gradients (grad_bytes=4) double an all-reduce's bytes; ZeRO-1 reduce-scatters them
    and all-gathers bf16 weights."""
    model = pl.Transformer(8, 1024, 16, seq_len=1024)
    comm = {(z, g): pl.predict(model, pl.Layout(dp=8, zero=z, grad_bytes=g), 64, "A100-80GB",
                               0.5, "full").terms["data parallel"]
            for z in (0, 1) for g in (2, 4)}
    link = pl.HARDWARE["A100-80GB"].intra
    psi = pl.stage_params(model, pl.Layout(dp=8), (8,))[0]
    for g in (2, 4):
        assert comm[0, g] == pytest.approx(pl.cm.allreduce_time(g * psi, 8, link.alpha,
                                                                link.beta))
        assert comm[1, g] == pytest.approx(
            pl.cm.reduce_scatter_time(g * psi, 8, link.alpha, link.beta)
            + pl.cm.all_gather_time(2 * psi, 8, link.alpha, link.beta))
    assert comm[0, 2] == pytest.approx(comm[1, 2])


def test_held_out_errors_beat_the_constant_overall_and_for_every_source_with_three_rows():
    table = pub.error_table()
    assert table["all"][0] == 26
    assert table["all"][1] < table["all"][2]
    for source, (n, planner, constant) in table.items():
        if n >= 3:
            assert planner < constant, source


def _meets_target(table):
    n, planner, constant = table["all"]
    return (planner <= 0.08 and planner <= constant - 0.03
            and all(p < c for m, p, c in table.values() if m >= 3))


def test_held_out_errors_reach_issue_30s_target_at_the_encoded_values_only():
    """Issue 30's target (mean error <= 8% on the 26 held-out rows, >= 3 points below the
    constant's, below it for every source with >= 3 rows) over the plausible values of the
    three unknowns that move the mean by more than half a point. It holds at the encoded values (7.4% against 10.8%), for every
    MT-NLG micro-batch size, and for Llama 3's v = 8 and 4; it fails at v = 2 (2.999 points
    below the baseline) and v = 1 (8.4%): the verdict rests on Sec. 3.3.2's reading of v."""
    n, planner, constant = pub.error_table()["all"]
    assert n == 26 and _meets_target(pub.error_table())
    assert planner == pytest.approx(0.074, abs=0.001) and constant == pytest.approx(0.108,
                                                                                  abs=0.001)
    ranges = pub.unknown_ranges()
    for name, by_value in ranges.items():
        encoded = next(iter(by_value.values()))[1]["all"]
        assert encoded[1] == pytest.approx(planner, abs=1e-4), name   # H100 refit, unrounded
        for value, (eff, table) in by_value.items():   # every source of 3+ rows still beats it
            assert all(p < c for k, (m, p, c) in table.items() if m >= 3), (name, value)
    llama = ranges["Llama 3 interleaving depth v"]
    assert {v: _meets_target(t) for v, (e, t) in llama.items()} == {8: True, 4: True, 2: False,
                                                                     1: False}
    assert llama[1][1]["all"][1] == pytest.approx(0.084, abs=0.002)
    assert {v for v, (e, t) in llama.items() if e is None} == {1, 2}
    mtnlg = ranges["MT-NLG micro-batch size"]
    assert all(_meets_target(t) for e, t in mtnlg.values())
    assert mtnlg[1][1]["smith2022"][1] > 0.15 and mtnlg[2][1]["smith2022"][1] < 0.05
    megascale = ranges["MegaScale's Megatron-LM micro-batch size"]
    assert all(_meets_target(t) for e, t in megascale.values())
    assert set(ranges) == {"Llama 3 interleaving depth v", "MT-NLG micro-batch size",
                           "MegaScale's Megatron-LM micro-batch size"}


def test_every_constant_is_labelled_with_where_it_comes_from():
    for name in pl.HARDWARE:
        origins = {k: origin for k, value, origin in pub.constant_origins(name)}
        assert origins["peak FLOP/s"] == "datasheet"
        assert origins["efficiency"].startswith(("fitted to", "borrowed from"))
    a100 = {k: o for k, v, o in pub.constant_origins("A100-80GB")}
    assert a100["gemm_half_width"].startswith("at its bound")
    assert a100["link_efficiency"].startswith("at its bound")
    h100 = {k: o for k, v, o in pub.constant_origins("H100-80GB")}
    assert h100["gemm_half_width"] == "borrowed from A100-80GB"


# ---- issue 30, second pass: recomputation, TP overlap, Llama 3's chunks, GPUs needed --------

RECOMPUTES = ("none", "selective", "full")


def test_selective_recomputation_repeats_the_scores_memory_traffic():
    """Selective recomputation repeats the forward's 2 bytes of traffic for each byte of the
    attention scores it drops, as full recomputation does for every byte it drops."""
    model = pl.Transformer(8, 1024, 16, seq_len=2048)
    layout = pl.Layout(tp=2, sequence_parallel=True)
    stored = pl.layer_activation_bytes(model, layout, "none")
    scores = stored - pl.layer_activation_bytes(model, layout, "selective")
    hbm = pl.HARDWARE["A100-80GB"].hbm_bandwidth
    per_layer = {mode: pl.predict(model, layout, 4, "A100-80GB", 0.5, mode)
                 .terms["memory-bound ops"] / (4 * 8) for mode in RECOMPUTES}
    assert per_layer["none"] == pytest.approx(5 * stored / hbm)
    assert per_layer["selective"] == pytest.approx((5 * stored + 2 * scores) / hbm)
    assert per_layer["full"] == pytest.approx(7 * stored / hbm)



def test_korthikanti_hfu_counts_three_times_the_recomputed_scores():
    """Table 5's HFU/MFU ratios follow the paper's 1 + s/3h (12 B s^2 h per layer recomputed,
    within its rounding to 0.1 point), while the 4 B s^2 h actually recomputed gives the
    planner's smaller ratio: a convention, outside the MFU rows the errors are measured on."""
    rows = [r for r in pub.runs_2022_2024() if r["source"] == "korthikanti2022_t3_t5"]
    hfu = {"GPT-22B": 43.7, "GPT-175B": 52.8, "GPT-530B": 57.0, "GPT-1T": 57.0}
    for r in rows:
        m, mfu = r["model"], 100 * r["published"]
        s, h, n, v = m.seq_len, m.hidden, m.num_layers, m.vocab
        paper = (1 + s / (3 * h) + v / (12 * h * n)) / (1 + s / (6 * h) + v / (12 * h * n))
        assert abs(mfu * paper - hfu[r["name"]]) <= 0.1, r["name"]
        exact = m.iteration_flops(1, "selective") / m.iteration_flops(1, "none")
        assert 1 < exact < paper
    m22 = rows[0]["model"]
    assert m22.iteration_flops(1, "selective") / m22.iteration_flops(1, "none") == \
        pytest.approx(1.0174, abs=2e-4)


def test_tp_overlap_hides_the_backward_input_gradients_behind_weight_gradients():
    model = pl.Transformer(8, 4096, 32, seq_len=2048)
    for sp in (False, True):
        plain = pl.Layout(tp=8, sequence_parallel=sp)
        hidden = pl.Layout(tp=8, sequence_parallel=sp, tp_overlap=True)
        a = pl.predict(model, plain, 8, "A100-80GB", 0.5, "selective")
        b = pl.predict(model, hidden, 8, "A100-80GB", 0.5, "selective")
        assert 0 < b.terms["tensor parallel"] < a.terms["tensor parallel"]
        assert a.step.comm == pytest.approx(b.step.comm)       # the bytes still travel
        # at most two of the four collectives' worth (without SP: 2 of 4 all-reduces)
        assert b.terms["tensor parallel"] >= a.terms["tensor parallel"] / 2 - 1e-12
    # over a slow network the collectives outlast the weight gradients: only those are hidden
    hw = pl.HARDWARE["A100-80GB"]
    slow = dataclasses.replace(hw, intra=hw.inter)
    a = pl.predict(model, pl.Layout(tp=8), 8, slow, 0.5, "none")
    b = pl.predict(model, pl.Layout(tp=8, tp_overlap=True), 8, slow, 0.5, "none")
    tokens, speed = 2048, hw.peak_flops * 0.5      # one sequence per micro-batch, 8 of them
    wgrad = 2 * tokens * 4096 * (4096 + 2 * 4096 + 4 * 4096) / 8 / speed
    assert (a.terms["tensor parallel"] - b.terms["tensor parallel"]) / (8 * 8) == \
        pytest.approx(wgrad, rel=1e-9)


def test_llama3_chunks_may_hold_only_the_embedding_or_the_output():
    """One layer per chunk, 8 chunks per rank: the 7-layer first and last stages are accepted
    (their extra chunk is the embedding or the output layer), a 7-layer middle stage is not."""
    model = pl.Transformer(30, 1024, 16, seq_len=1024)
    ok = pl.Layout(pp=4, virtual_stages=8, stage_layers=(7, 8, 8, 7))
    pl.predict(model, ok, 8, "H100-80GB", 0.5, "selective")
    with pytest.raises(ValueError, match="one fewer on the first and last"):
        pl.predict(model, pl.Layout(pp=4, virtual_stages=8, stage_layers=(8, 7, 8, 7)), 8,
                   "H100-80GB", 0.5, "selective")
    no_dropout = dataclasses.replace(model, dropout=False)
    s, h = 1024, 1024
    assert (pl.layer_activation_bytes(model, pl.Layout(), "selective")
            - pl.layer_activation_bytes(no_dropout, pl.Layout(), "selective")) == 2 * s * h
    v8 = pub.unknown_ranges()["Llama 3 interleaving depth v"][pub.LLAMA3_CHUNKS][1]
    assert v8["dubey2024"][1] == pytest.approx(
        abs(next(r["error"] for r in pub.validate() if r["num_gpus"] == 16384)), abs=1e-4)


def test_gpus_needed_is_the_fewest_that_finish_with_its_range():
    from labutils.cost import capacity
    model = pl.Transformer(32, 4096, 32, seq_len=4096, vocab=32000)
    kw = dict(zero_stages=(1,), micro_batches=(1,), virtual_stages=(1,),
              sequence_parallel=(True,), recompute="selective")
    tokens, batch = 1e11, 512
    steps = tokens / (batch * model.seq_len)
    got = capacity.gpus_needed(model, tokens, 7 * 86400, "A100-80GB", batch, **kw)
    n, pred = got["gpus"], got["prediction"]
    assert n is not None and got["seconds"] <= 7 * 86400
    assert got["seconds"] == pytest.approx(steps * pred.step.total)
    fewer = [c for c in capacity.node_counts("A100-80GB") if c < n]
    for c in fewer:   # every smaller count tried is too slow or finds no layout
        best = pl.search(model, c, batch, "A100-80GB", top=1, **kw)
        assert not best or steps * best[0].step.total > 7 * 86400
    few, many = got["gpus_range"]
    assert few <= n <= many
    fast, slow = got["seconds_range"]
    assert fast < got["seconds"] < slow
    low, high = got["efficiency_range"]
    assert low < pl.HARDWARE["A100-80GB"].efficiency < high
    # a bigger budget never needs fewer GPUs; an impossible one says so
    assert capacity.gpus_needed(model, 4 * tokens, 7 * 86400, "A100-80GB", batch,
                                **kw)["gpus"] >= n
    assert capacity.gpus_needed(model, tokens, 1.0, "A100-80GB", batch, gpu_counts=(8,),
                                **kw)["gpus"] is None
    with pytest.raises(ValueError, match="tokens and seconds"):
        capacity.gpus_needed(model, 0, 1.0, "A100-80GB", batch)


def test_a_forecasts_range_comes_from_held_out_rows_not_the_fitting_rows():
    """gpus_needed's efficiency range: the fitted efficiency times the least and the most that
    any one held-out row needs alone; the fitting rows' own spread does not enter it."""
    from labutils.cost import capacity
    ratios = capacity.held_out_efficiency_ratios()
    assert len(ratios) == 26 and min(ratios) < 1 < max(ratios)
    low, fitted, high = capacity.efficiency_range("A100-80GB")
    assert fitted == pl.HARDWARE["A100-80GB"].efficiency
    assert low == pytest.approx(fitted * min(ratios)) and high == pytest.approx(
        min(fitted * max(ratios), 1.0))
    in_sample = pub.in_sample_table()
    assert in_sample["narayanan2021"][0] == 10 and in_sample["dubey2024"][1] < 1e-3
