"""Megatron tensor parallelism (labutils.parallel.tensor_parallel, lab 06b): every parallel block equal to
its single-process block (outputs and all gradients) on 2 and 4 real ranks, bytes counted equal
to the formula, PyTorch's parallelize_module equal too, bad splits refused before launch."""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import labutils as lu
from labutils import tensor_parallel as tp

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
    assert res["forward_bytes"] == formula["forward"]
    assert res["backward_bytes"] == formula["backward"]
    first = "fc1.weight" if block == "mlp" else "qkv.weight"
    width = 64 if block == "mlp" else 48
    assert res["param_shapes"][first] == (width // world_size, 16)


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
            lu.launch(_gathered_column, 3, world_size=world_size)):
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


# ---- exercise checker ---------------------------------------------------------------------

def _no_gather(rank, world_size, x, w, b):
    return x @ w.T + b


def _gather_on_wrong_dim(rank, world_size, x, w, b):
    y = x @ w.T + b
    parts = [torch.empty_like(y) for _ in range(world_size)]
    dist.all_gather(parts, y)
    return torch.cat(parts, dim=0)


def _bias_forgotten(rank, world_size, x, w, b):
    return tp.column_parallel_linear(rank, world_size, x, w, torch.zeros_like(b))


def _stub(rank, world_size, x, w, b):
    raise NotImplementedError


@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(tp.column_parallel_linear, {
    "no_gather": (_no_gather, "rank 0, shape: expected [3, 16], got [3, 8]"),
    "gather_on_wrong_dim": (_gather_on_wrong_dim, "rank 0, shape: expected [3, 16], got [6, 8]"),
    "bias_forgotten": (_bias_forgotten, "rank 0, element [0, 0]: expected"),
    "stub": (_stub, "not implemented yet"),
}, passes="2 cases passed"))
def test_checker_accepts_the_reference_and_rejects_typical_mistakes(answer, verdict):
    assert_check(lu.check_column_parallel_linear, answer, verdict)
