"""Megatron tensor parallelism (labutils.parallel.tensor_parallel, lab 06b): every parallel block
(MLP, attention, a layer of both) equal to its single-process block (outputs and all gradients)
on 2 and 4 real ranks, bytes and all-reduces counted equal to the formula, PyTorch's
parallelize_module equal too, bad splits refused before launch; the timing experiment's shape
(no timed assertions); TP's bytes against DP's, both counted at the dispatcher (the layer's
crossover at 3H + 2.25 tokens found by counting); the f and g and the crossover checkers against
typical mistakes."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

import labutils as lu
from labutils import tensor_parallel as tp
from labutils.core.timeline import Span
from labutils.core.timing import Stats
from labutils.exercises import lab06b

from .checkers import assert_check, checker_cases

pytestmark = pytest.mark.lab06b


# ---- pure logic, no processes -------------------------------------------------------------

@pytest.mark.parametrize("hidden, heads, tp_size, words", [
    (18, None, 4, "hidden size 18 is not divisible by the tensor-parallel size 4"),
    (16, 6, 4, "number of attention heads 6 is not divisible"),
    (16, 3, 1, "not divisible by 3 heads"),
])
def test_bad_split_is_refused_before_any_process_starts(monkeypatch, hidden, heads, tp_size,
                                                        words):
    def no_launch(*a, **k):
        raise AssertionError("a process was started for a bad configuration")
    monkeypatch.setattr(lu.tp_equivalence, "launch", no_launch)
    block = "attention" if heads else "mlp"
    with pytest.raises(ValueError, match=words):
        lu.tp_equivalence.run_block_check(block, tp_size, hidden=hidden, num_heads=heads or 4)


def test_error_names_a_valid_tensor_parallel_size():
    with pytest.raises(ValueError, match=r"Use a tensor-parallel size in \[1, 2, 3, 6\]"):
        tp.validate_tp_config(18, None, 4, ffn_hidden=72)


def test_qkv_shard_gives_each_rank_whole_heads_of_q_k_and_v():
    w = torch.arange(12.0).repeat_interleave(2).view(12, 2)  # rows q0..q3 k0..k3 v0..v3
    got = tp.shard(w, tp.TPLayout(1, 2), dim=0, groups=3)[:, 0]
    torch.testing.assert_close(got, torch.tensor([2.0, 3.0, 6.0, 7.0, 10.0, 11.0]))


def test_one_rank_layout_is_the_reference_block():
    torch.manual_seed(0)
    ref = tp.SelfAttention(8, 2)
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(tp.ParallelSelfAttention(ref, tp.TPLayout(0, 1))(x), ref(x))


def test_formula_counts_one_activation_all_reduce_each_way():
    f = tp.comm_bytes_formula(batch=2, seq=4, hidden=16, tp_world_size=4)
    assert f["forward"] == f["backward"] == 2 * 4 * 16 * 4
    assert f["forward_ring_per_rank"] == pytest.approx(512 * 2 * 3 / 4)
    assert tp.comm_bytes_formula(2, 4, 16, 1)["forward"] == 0


def test_reference_comparison_can_fail():
    args = ("mlp", 2, 4, 16, 4, 0)
    torch.manual_seed(0)
    fake = {"output": torch.zeros(2, 4, 16), "input_grad": torch.zeros(2, 4, 16), "grads": {}}
    with pytest.raises(AssertionError, match="rank 0, output"):
        lu.tp_equivalence.assert_matches_reference([fake, fake], *args)


# ---- real ranks -------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("block", ["mlp", "attention"])
def test_parallel_block_equals_single_process(block, world_size):
    # run_block_check asserts output, input grad and every parameter-grad slice per rank.
    res = lu.tp_equivalence.run_block_check(block, world_size, batch=2, seq=4, hidden=16, num_heads=4)
    assert set(res["max_abs_diff"]) >= {"output", "input grad"}
    assert len(res["max_abs_diff"]) == 2 + 4          # two weights and two biases checked
    formula = tp.comm_bytes_formula(2, 4, 16, world_size)
    assert (res["forward_calls"], res["backward_calls"]) == (1, 1)
    # counted at the dispatcher: g's all-reduce forward, f's backward, nothing else
    assert res["forward_ops"] == res["backward_ops"] == {"allreduce_": 1}
    assert res["forward_bytes"] == formula["forward"]
    assert res["backward_bytes"] == formula["backward"]
    first = "fc1.weight" if block == "mlp" else "qkv.weight"
    width = 64 if block == "mlp" else 48
    assert res["param_shapes"][first] == (width // world_size, 16)


@pytest.mark.slow
def test_parallel_layer_equals_single_process_with_four_all_reduces():
    res = lu.tp_equivalence.run_block_check("layer", 2, batch=2, seq=4, hidden=16, num_heads=4)
    assert len(res["max_abs_diff"]) == 2 + 8          # attention's and the MLP's 4 params each
    assert (res["forward_calls"], res["backward_calls"]) == (2, 2)
    formula = tp.comm_bytes_formula(2, 4, 16, 2)
    assert res["forward_bytes"] == 2 * formula["forward"]
    assert res["param_shapes"]["attn.qkv.weight"] == (24, 16)
    n_params = sum(p.numel() for p in tp.TransformerLayer(16, 4).parameters())
    assert res["dp_bytes"] == 4 * n_params == 4 * (12 * 16 * 16 + 9 * 16)


@pytest.mark.slow
@pytest.mark.parametrize("block", ["mlp", "attention", "layer"])
def test_dp_bytes_are_the_gradients_whatever_the_batch(block):
    ref = {"mlp": tp.MLP(16), "attention": tp.SelfAttention(16, 4),
           "layer": tp.TransformerLayer(16, 4)}[block]
    n_params = sum(p.numel() for p in ref.parameters())
    for batch in (2, 8):
        res = lu.tp_equivalence.run_block_check(block, 2, batch=batch, seq=4, hidden=16)
        assert res["dp_bytes"] == 4 * n_params


@pytest.mark.slow
def test_dp_bytes_are_none_when_the_batch_does_not_divide():
    res = lu.tp_equivalence.run_block_check("mlp", 2, batch=3, seq=4, hidden=16)
    assert res["dp_bytes"] is None and res["forward_bytes"] == 3 * 4 * 16 * 4


@pytest.mark.slow
@pytest.mark.parametrize("hidden", [16, 32])
def test_a_layers_tp_bytes_pass_dp_bytes_at_the_checkers_crossover(hidden):
    # counted on both sides of the reference answer 3H + 2.25 (seq 2: whole, even batches)
    cross = lab06b.crossover_tokens(hidden, 2)
    assert cross == 3 * hidden + 2.25
    for tokens in (int(cross) - 2, int(cross) + 2):     # 48 and 52 at H = 16
        res = lu.tp_equivalence.run_block_check("layer", 2, batch=tokens // 2, seq=2,
                                                hidden=hidden, num_heads=4)
        tp_bytes = res["forward_bytes"] + res["backward_bytes"]
        assert (tp_bytes > res["dp_bytes"]) == (tokens > cross)


def test_reference_shards_find_the_slice_under_a_prefix():
    g = torch.arange(48.0 * 16).view(48, 16)
    layout = tp.TPLayout(1, 2)
    torch.testing.assert_close(tp.reference_shards("attn.qkv.weight", g, layout),
                               tp.shard(g, layout, 0, groups=3))
    torch.testing.assert_close(tp.reference_shards("mlp.fc2.bias", g[0], layout), g[0])


def _gathered_column(rank, world_size, seed):
    torch.manual_seed(seed)
    linear = nn.Linear(6, 8)
    x = torch.randn(3, 6, requires_grad=True)
    layer = tp.ColumnParallelLinear(linear, tp.TPLayout(rank, world_size), gather_output=True)
    y = layer(x)
    (y * torch.arange(8.0)).sum().backward()
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_column_parallel_with_gathered_output_equals_linear(world_size):
    torch.manual_seed(3)
    linear = nn.Linear(6, 8)
    x = torch.randn(3, 6, requires_grad=True)
    y = linear(x)
    (y * torch.arange(8.0)).sum().backward()
    for rank, (y_r, x_grad, w_grad, b_grad) in enumerate(
            lu.launch(_gathered_column, 3, world_size=world_size, warn_oversubscription=False)):
        layout = tp.TPLayout(rank, world_size)
        torch.testing.assert_close(y_r, y.detach())
        torch.testing.assert_close(x_grad, x.grad)
        torch.testing.assert_close(w_grad, tp.shard(linear.weight.grad, layout, 0))
        torch.testing.assert_close(b_grad, tp.shard(linear.bias.grad, layout, 0))


@pytest.mark.slow
def test_parallelize_module_equals_reference_and_our_shards():
    res = lu.tp_equivalence.run_dtensor_check(2)
    assert res["placements"] == {"fc1.weight": "S(0)", "fc1.bias": "S(0)",
                                 "fc2.weight": "S(1)", "fc2.bias": "R"}
    assert res["comm_counts"] == {"all_reduce": 2}    # one forward, one backward, as ours


# ---- timing experiment (its shape, never its speed) ----------------------------------------

def test_comm_summary_counts_overlapping_all_reduces_once():
    spans = [Span(0, "forward", 0.0, 1.0), Span(0, "allreduce", 1.0, 2.0),     # fully exposed
             Span(1, "backward", 0.0, 2.0), Span(1, "allreduce", 1.0, 3.0),    # half covered,
             Span(1, "allreduce", 2.0, 3.0)]                                   # two in flight
    got = lu.tp_timing.comm_summary(spans)
    assert got[0] == {"step": 2.0, "in flight": 1.0, "exposed": 1.0}
    assert got[1] == {"step": 3.0, "in flight": 2.0, "exposed": 0.5}


def test_comm_stats_gives_the_spread_over_steps():
    steps = [[Span(0, "forward", 0.0, 1.0), Span(0, "allreduce", 1.0, 1.0 + d)] for d in (1, 3)]
    got = lu.tp_timing.comm_stats(steps)[0]
    assert (got["in flight"].min, got["in flight"].max, got["in flight"].n) == (1.0, 3.0, 2)
    assert got["exposed"].values == (1.0, 1.0)


@pytest.mark.slow
def test_timing_returns_stats_of_each_variant_and_counts_the_all_reduces():
    res = lu.tp_timing.run(world_size=2, hidden=32, num_heads=4, batch=4, seq=8, repeats=5,
                           bucket_cap_mb=0.005)
    assert set(res["stats"]) == {"1 rank", "TP", "DP"}
    assert all(isinstance(s, Stats) and s.n == 5 for s in res["stats"].values())
    assert res["tp_equal"] and res["dp_equal"]
    assert res["calls"]["TP"] == (2, 2) and res["calls"]["1 rank"] == (0, 0)
    assert res["calls"]["DP"][0] == 0 and res["calls"]["DP"][1] >= 2   # one per bucket
    one = tp.comm_bytes_formula(4, 8, 32, 2)["forward"]              # B·T·H·4
    assert res["bytes"]["TP"] == (2 * one, 2 * one)                  # g, g; f, f
    n_params = sum(p.numel() for p in tp.TransformerLayer(32, 4).parameters())
    assert res["bytes"]["DP"] == (0, 4 * n_params) and res["bytes"]["1 rank"] == (0, 0)
    assert len(res["steps"]["TP"]) == len(res["steps"]["DP"]) == 5
    tp_spans, dp_spans = res["spans"]["TP"], res["spans"]["DP"]
    assert sorted(s.label for s in tp_spans if s.name == "allreduce" and s.rank == 0) == \
        ["f", "f", "g", "g"]
    stats = lu.tp_timing.comm_stats(res["steps"]["DP"])
    assert set(stats) == {0, 1} and all(st["in flight"].n == 5 for st in stats.values())
    assert {r["exposed"] for r in lu.tp_timing.comm_summary(tp_spans).values()} == {1.0}
    assert {s.name for s in dp_spans} >= {"forward", "backward", "allreduce", "wait"}
    for rank in (0, 1):   # the timeline's DDP buckets are the timed DDP's
        launches = [s.start for s in dp_spans if s.name == "allreduce" and s.rank == rank]
        back = next(s for s in dp_spans if s.name == "backward" and s.rank == rank)
        assert len(launches) == res["calls"]["DP"][1]
        assert back.start <= min(launches) < back.end   # launched while backward computes
    assert res["threads"] >= 1


def test_run_reports_equality_only_when_every_rank_agrees(monkeypatch):
    stats = {v: Stats.of([1.0]) for v in lu.tp_timing.VARIANTS}
    calls = {"1 rank": (0, 0), "TP": (2, 2), "DP": (0, 3)}
    nbytes = {"1 rank": (0, 0), "TP": (8, 8), "DP": (0, 24)}
    steps = [{"stats": stats, "calls": calls, "bytes": nbytes, "tp_equal": ok, "dp_equal": True,
              "threads": 1} for ok in (True, False)]  # rank 1's TP slices differ
    monkeypatch.setattr(lu.tp_timing, "launch",
                        lambda fn, *a, **k: steps if fn is lu.tp_timing.step_worker
                        else [{"TP": [[]] * 3, "DP": [[]] * 3}] * 2)
    res = lu.tp_timing.run(world_size=2, hidden=32, num_heads=4, batch=4, seq=8,
                           timeline_steps=3)
    assert res["tp_equal"] is False and res["dp_equal"] is True


def test_run_refuses_ranks_that_handed_different_bytes(monkeypatch):
    stats = {v: Stats.of([1.0]) for v in lu.tp_timing.VARIANTS}
    calls = {"1 rank": (0, 0), "TP": (2, 2), "DP": (0, 3)}
    steps = [{"stats": stats, "calls": calls, "bytes": {"1 rank": (0, 0), "TP": (8, 8),
                                                         "DP": (0, n)},
              "tp_equal": True, "dp_equal": True, "threads": 1} for n in (24, 28)]
    monkeypatch.setattr(lu.tp_timing, "launch", lambda fn, *a, **k: steps)
    with pytest.raises(AssertionError, match="ranks issued different all-reduces"):
        lu.tp_timing.run(world_size=2, hidden=32, num_heads=4, batch=4, seq=8)


# ---- exercise checker ---------------------------------------------------------------------

def _pair(f_forward, f_backward, g_forward, g_backward):
    """Autograd Functions f and g built from four (tensor -> tensor) pieces."""
    class MyF(torch.autograd.Function):
        forward = staticmethod(lambda ctx, x: f_forward(x))
        backward = staticmethod(lambda ctx, grad: f_backward(grad))

    class MyG(torch.autograd.Function):
        forward = staticmethod(lambda ctx, x: g_forward(x))
        backward = staticmethod(lambda ctx, grad: g_backward(grad))
    return MyF, MyG


def _same(t):
    return t.view_as(t)


def _sum(t):
    t = t.clone()
    dist.all_reduce(t)
    return t


def _mean(t):
    return _sum(t) / dist.get_world_size()


def _twice(t):
    return _sum(_sum(t))


def _stub(t):
    raise NotImplementedError


def _sum_in_place(t):
    dist.all_reduce(t)          # no clone: still right, nothing else reads what it overwrites
    return t


_ANSWERS = {
    "swapped": (_pair(_sum, _same, _same, _sum), "f and g swapped"),
    "f_backward_missing": (_pair(_same, _same, _sum, _same),
                           "f's backward does not all-reduce the input gradient"),
    "g_forward_missing": (_pair(_same, _sum, _same, _same),
                          "g's forward does not all-reduce the partial outputs"),
    "f_backward_twice": (_pair(_same, _twice, _sum, _same), "f's backward all-reduces twice"),
    "g_forward_twice": (_pair(_same, _sum, _twice, _same), "g's forward all-reduces twice"),
    "f_averages": (_pair(_same, _mean, _sum, _same), "f's backward averages"),
    "g_averages": (_pair(_same, _sum, _mean, _same), "g's forward averages"),
    "g_backward_reduces": (_pair(_same, _sum, _sum, _sum), "g's backward all-reduces"),
    "f_forward_reduces": (_pair(_sum, _sum, _sum, _same), "f's forward all-reduces"),
    "scaled": (_pair(_same, lambda t: 3 * _sum(t), _sum, _same), "for 'f backward', element"),
    "stub": (_pair(_stub, _stub, _stub, _stub), "not implemented yet"),
}


@pytest.mark.parametrize("f, g, words", [
    (("own", "sum"), ("sum", "own"), None),
    (("sum", "own"), ("own", "sum"), "swapped"),
    (("own", "own"), ("sum", "own"), "f's backward does not all-reduce"),
    (("own", "sum"), ("mean", "own"), "g's forward averages"),
])
def test_diagnosis_names_the_mistake(f, g, words):
    got = lab06b._diagnosis(f, g)
    assert got is None if words is None else words in got
    assert got is None or len(repr(got)) <= 60         # shown whole in the check's message


@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(
    lab06b.f_and_g, {name: (lambda a=a: a, words) for name, (a, words) in _ANSWERS.items()},
    passes="2 cases passed",
    also_right={"in_place_and_returns_x": lambda: _pair(lambda t: t, _sum_in_place,
                                                       _sum_in_place, lambda t: t)}))
def test_checker_accepts_the_reference_and_rejects_typical_mistakes(answer, verdict):
    # each answer is a function returning (f, g), as the reference f_and_g is
    assert_check(lambda pair: lu.check_f_and_g(*pair()), answer, verdict)


def test_checker_refuses_something_that_is_not_an_autograd_function():
    with pytest.raises(TypeError, match="two torch.autograd.Function classes"):
        lu.check_f_and_g(lambda x: x, lambda x: x)


# ---- the crossover checker (no processes) -------------------------------------------------

def _ring_one_side(h, p):
    return lab06b.crossover_tokens(h, p) * 2 * (p - 1) / p


@pytest.mark.parametrize("answer, verdict", checker_cases(lab06b.crossover_tokens, {
    "forward_only": (lambda h, p: (12 * h * h + 9 * h) / (2 * h), "twice the crossover"),
    "eight_all_reduces": (lambda h, p: (12 * h * h + 9 * h) / (8 * h), "half the crossover"),
    "bytes_vs_elements": (lambda h, p: (12 * h * h + 9 * h) / (4 * h * 4),
                          ("a quarter of the crossover", "bytes and the other in elements")),
    "elements_vs_bytes": (lambda h, p: (12 * h * h + 9 * h) * 4 / (4 * h),
                          "4 times the crossover"),
    "ring_factor_on_one_side": (_ring_one_side, ("changes with the tensor-parallel size",
                                                 "2(p-1)/p")),
    "divides_by_p": (lambda h, p: (12 * h * h + 9 * h) / (4 * h) / p,
                     "changes with the tensor-parallel size"),
    "mlp_only": (lambda h, p: 4 * h + 2.5, "the MLP block's crossover"),
    "attention_only": (lambda h, p: 2 * h + 2, "the attention block's crossover"),
    "no_biases": (lambda h, p: 3 * h, "leaves out the biases"),
    "rounded_up": (lambda h, p: float(int(3 * h + 2.25) + 1), "a whole number next to"),
    "something_else": (lambda h, p: 5 * h, ("expected 770.25, got 1280", "their quotient")),
    "not_a_number": (lambda h, p: "770", "expected a number of tokens, got str"),
    "stub": (lambda h, p: None, "not implemented yet"),
}, passes="4 cases passed", also_right={"integer_arithmetic": lambda h, p: (12 * h + 9) / 4}))
def test_crossover_checker_accepts_the_answer_and_names_typical_mistakes(answer, verdict):
    result = assert_check(lu.check_crossover_tokens, answer, verdict)
    assert result.passed or result.message.rstrip().endswith((".", "FILL ME IN"))  # whole sentences


def test_crossover_reference_is_the_counted_bytes_quotient():
    h = 256   # 06b's timed shape: 4 all-reduces of B·T·H·4 bytes against the gradients' bytes
    n_params = sum(p.numel() for p in tp.TransformerLayer(h, 8).parameters())
    per_token = 4 * tp.comm_bytes_formula(1, 1, h, 2)["forward"]
    assert lab06b.crossover_tokens(h, 2) == 4 * n_params / per_token == 770.25


def test_crossover_checker_refuses_a_result_instead_of_a_function():
    with pytest.raises(TypeError, match="needs your function itself"):
        lu.check_crossover_tokens(770.25)
