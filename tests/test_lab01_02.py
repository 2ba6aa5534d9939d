"""Labs 01 and 02: their checkers accept the reference and name what is wrong in the typical
mistakes; ``timed_launch`` times the work inside the ranks and the launch apart (lab 01)."""
import time

import pytest
import torch
import torch.distributed as dist

import labutils as lu
from labutils.core.launcher import timed_launch
from labutils.exercises import lab01, lab02

from .checkers import assert_check, checker_cases, square_function

pytestmark = [pytest.mark.usefixtures("one_thread")]


# ---- lab 01: max_allreduce ------------------------------------------------------------------

def _sums(rank, world_size):
    t = lab01.start(rank, world_size)
    dist.all_reduce(t)
    return t


def _reduces_to_rank_0(rank, world_size):
    t = lab01.start(rank, world_size)
    dist.reduce(t, dst=0, op=dist.ReduceOp.MAX)
    return t


def _no_collective(rank, world_size):
    return lab01.start(rank, world_size)


def _stub(rank, world_size):
    # FILL ME IN
    raise NotImplementedError


@pytest.mark.lab01
def test_no_rank_starts_with_the_maximum():
    for world_size in (2, 3):
        every = torch.stack([lab01.start(r, world_size) for r in range(world_size)])
        top = every.max(0).values
        assert not any(torch.equal(row, top) for row in every)
        assert not torch.equal(every.sum(0), top)


@pytest.mark.lab01
@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(lab01.max_allreduce, {
    "sums": (_sums, "all_reduce sums unless op=ReduceOp.MAX"),
    "reduce_to_rank_0": (_reduces_to_rank_0, ("rank 1", "no collective changed it")),
    "no_collective": (_no_collective, "no collective changed it"),
    "stub": (_stub, "not implemented yet"),
}, passes="2 cases passed"))
def test_check_max_allreduce(answer, verdict):
    assert_check(lu.check_max_allreduce, answer, verdict)


# ---- lab 01: mlp_flops_per_sample -----------------------------------------------------------

@pytest.mark.lab01
@pytest.mark.parametrize("sizes", [(64, 128, 128, 128, 10), (3, 5), (7, 1, 9), (64, 512, 10)])
def test_flops_formula_equals_pytorchs_count(sizes):
    assert lab01.mlp_flops_per_sample(sizes) == lab01.counted_flops_per_sample(sizes)


def _weights(sizes):
    return sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))


@pytest.mark.lab01
@pytest.mark.parametrize("answer, verdict", checker_cases(lab01.mlp_flops_per_sample, {
    "forward_only": (lambda s: 2 * _weights(s), "forward pass alone"),
    "no_input_gradients": (lambda s: 4 * _weights(s), "gradient of its input"),
    "six_per_weight": (lambda s: 6 * _weights(s), "the data does not require grad"),
    "six_per_parameter": (lambda s: 6 * sum(a * b + b for a, b in zip(s[:-1], s[1:])),
                          "standard 6ND estimate"),
    "a_string": (lambda s: "237056", "expected a number"),
    "stub": (lambda s: (_ for _ in ()).throw(NotImplementedError()), "not implemented yet"),
}, passes="equal to FlopCounterMode's count"))
def test_check_mlp_flops_per_sample(answer, verdict):
    assert_check(lu.check_mlp_flops_per_sample, answer, verdict)


# ---- lab 01: the launch timed apart from the work --------------------------------------------

def _sleeps_on_rank_1(rank, world_size, seconds):
    if rank == 1:
        time.sleep(seconds)
    return rank * 10


@pytest.mark.lab01
@pytest.mark.slow
def test_timed_launch_times_the_work_inside_the_ranks_and_the_launch_apart():
    results, seconds, wall = timed_launch(_sleeps_on_rank_1, 0.3, world_size=2)
    assert results == [0, 10]
    assert len(seconds) == 2
    assert seconds[1] >= 0.3                 # the sleep happened inside rank 1's clock
    assert wall > max(seconds)               # the launch itself costs something on top


# ---- lab 02: Square -------------------------------------------------------------------------

class _SquareStub(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad_output):
        raise NotImplementedError


class _Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return 3 * x ** 2 * grad_output


@pytest.mark.lab02
@pytest.mark.parametrize("answer, verdict", checker_cases(lab02.Square, {
    "half": (square_function(lambda x, g: x * g), "half of it"),
    "no_grad_output": (square_function(lambda x, g: 2 * x), "ignores grad_output"),
    "wrong_forward": (_Cube, "forward should return x ** 2"),
    "stub": (_SquareStub, "not implemented yet"),
}, passes="gradcheck passed"))
def test_check_square(answer, verdict):
    assert_check(lu.check_square, answer, verdict)


# ---- lab 02: count_graph_nodes --------------------------------------------------------------

@pytest.mark.lab02
def test_count_graph_nodes_counts_shared_nodes_once():
    a = torch.randn(3, requires_grad=True)
    h = a.exp()
    loss = (h * h).sum()                    # Sum, Mul, Exp, AccumulateGrad: Mul reaches Exp twice
    assert lab02.count_graph_nodes(loss) == 4
    assert lab02._paths(loss.grad_fn) == 6


@pytest.mark.lab02
@pytest.mark.parametrize("answer, verdict", checker_cases(lab02.count_graph_nodes, {
    "one_per_path": (lambda t: lab02._paths(t.grad_fn), "once per path"),
    "first_edge_only": (lambda t: lab02._first_branch(t.grad_fn), "only the first edge"),
    "no_leaves": (lab02._without_leaves, "AccumulateGrad"),
    "stub": (lambda t: (_ for _ in ()).throw(NotImplementedError()), "not implemented yet"),
}, passes="3 graphs passed"))
def test_check_count_graph_nodes(answer, verdict):
    assert_check(lu.check_count_graph_nodes, answer, verdict)
