"""labutils.parallel.model_parallel: naive model parallelism, checked against one process (lab 05)."""
import itertools
import warnings
from functools import partial

import pytest
import torch
import torch.distributed as dist

import labutils as lu
from labutils import model_parallel as mp

from .checkers import assert_check, checker_cases

pytestmark = pytest.mark.lab05


def _batch(n=12, d_in=16, d_out=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g), torch.randn(n, d_out, generator=g)


MODEL = partial(mp.make_mlp, 6, 32, 16, 4, 0)


# ---- pure logic, no processes -----------------------------------------------------------

def test_split_sizes_even_and_errors():
    assert mp.split_sizes(8, 3) == [3, 3, 2]
    assert mp.split_sizes(4, 4) == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="cannot split a model of 4 layers into 6 stages"):
        mp.split_sizes(4, 6)
    with pytest.raises(ValueError, match="one layer count per rank"):
        mp.validate_sizes([2, 2], 4, 3)
    with pytest.raises(ValueError, match="summing to the model's 4 layers"):
        mp.validate_sizes([2, 1], 4, 2)


def test_split_model_chains_to_the_whole_model_and_keeps_names():
    model = MODEL()
    x, _ = _batch()
    stages = mp.split_model(model, 3)
    out = x
    for stage in stages:
        out = stage(out)
    torch.testing.assert_close(out, model(x))
    names = [n for s in stages for n, _ in s.named_parameters()]
    assert names == [n for n, _ in model.named_parameters()]
    assert mp.boundary_shapes(stages, x) == [(12, 16), (12, 32), (12, 32)]


def test_balanced_sizes_is_optimal_by_brute_force():
    costs = [1, 1, 1, 1, 1, 1, 4, 4]
    for n_stages in (2, 3, 4):
        best = min(max(mp.stage_costs(costs, list(sizes)))
                   for sizes in itertools.product(range(1, 8), repeat=n_stages)
                   if sum(sizes) == len(costs))
        sizes = mp.balanced_sizes(costs, n_stages)
        assert sum(sizes) == len(costs) and len(sizes) == n_stages
        assert max(mp.stage_costs(costs, sizes)) == best
    assert mp.balanced_sizes(costs, 2) == [6, 2]
    with pytest.raises(ValueError, match="into 9 stages"):
        mp.balanced_sizes(costs, 9)


def test_bad_configurations_raise_before_any_process():
    x, y = _batch()
    with pytest.raises(ValueError, match="use at most 6 stages"):
        mp.run_naive_model_parallel(MODEL, x, y, world_size=8)
    with pytest.raises(ValueError, match="cannot be split evenly over 3 ranks"):
        lu.split_matmul.run_split_matmul(torch.ones(2, 4), torch.ones(4, 8), world_size=3, how="column")
    with pytest.raises(ValueError, match="how must be"):
        lu.split_matmul.run_split_matmul(torch.ones(2, 4), torch.ones(4, 8), how="diagonal")


# ---- real ranks ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_naive_model_parallel_equals_one_process(world_size):
    x, y = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = mp.run_naive_model_parallel(MODEL, x, y, world_size=world_size, steps=3)
    ref = mp.reference_step(MODEL, x, y, steps=3)
    torch.testing.assert_close(results[-1]["output"], ref["output"])
    torch.testing.assert_close(results[-1]["losses"], ref["losses"])
    grads = mp.merge_stage_results(results, "grads")
    assert set(grads) == set(ref["grads"])                # every gradient, each on one rank
    torch.testing.assert_close(grads, ref["grads"])
    torch.testing.assert_close(mp.merge_stage_results(results, "params"), ref["params"])
    # naive model parallelism: ranks take turns, so each is idle most of the step
    from labutils.core.timeline import bubble_fraction, flatten
    assert all(r["output"] is None for r in results[:-1])
    assert bubble_fraction(flatten([r["spans"] for r in results])) > 0


@pytest.mark.slow
def test_memory_per_rank_falls_below_the_single_process_peak():
    model_fn = partial(mp.make_mlp, 8, 128, 64, 10, 0)
    x, y = _batch(64, 64, 10)
    single = mp.single_process_peak(model_fn, x, y)
    assert single == mp.single_process_peak(model_fn, x, y)   # measured bytes reproduce
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peaks = {ws: [r["peak_bytes"] for r in mp.run_naive_model_parallel(
            model_fn, x, y, world_size=ws, measure_memory=True)] for ws in (2, 4)}
    assert max(peaks[2]) < single and max(peaks[4]) < max(peaks[2])
    # each rank holds at least its own weights and their gradients
    for ws, per_rank in peaks.items():
        stages = mp.split_model(model_fn(), ws)
        for stage, peak in zip(stages, per_rank):
            assert peak >= 2 * mp.weight_bytes(stage)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_split_matmuls_equal_the_full_matmul(world_size):
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(5, 8, generator=g), torch.randn(8, 12, generator=g)
    for how in ("column", "row"):
        for y in lu.split_matmul.run_split_matmul(x, w, world_size=world_size, how=how):
            torch.testing.assert_close(y, x @ w)


def _microbatched(rank, world_size, x, n_microbatches):
    return mp.microbatched_forward(rank, world_size, mp.split_model(MODEL(), world_size), x,
                                   n_microbatches)


@pytest.mark.slow
def test_microbatched_forward_equals_the_whole_batch():
    from labutils import launch
    x, _ = _batch()
    results = launch(_microbatched, x, 4, world_size=3, timeout=60)
    with torch.no_grad():
        torch.testing.assert_close(results[-1][0], MODEL()(x))
    assert [len(spans) for _, spans in results] == [4, 4, 4]


# ---- the exercise checker ----------------------------------------------------------------

def _forgets_to_send(rank, world_size, stage_input, stage_output, loss):
    if rank == world_size - 1:
        loss.backward()
    else:
        grad_output = torch.empty_like(stage_output)
        dist.recv(grad_output, src=rank + 1)
        mp.backward_from(stage_output, grad_output)


def _sends_zeros(rank, world_size, stage_input, stage_output, loss):
    _forgets_to_send(rank, world_size, stage_input, stage_output, loss)
    if rank > 0:
        dist.send(torch.zeros_like(stage_input), dst=rank - 1)


def _not_done(rank, world_size, stage_input, stage_output, loss):
    raise NotImplementedError


@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(mp.naive_backward, {
    "sends_zeros": (_sends_zeros, ("rank 0", "expected", "got 0.0")),
    "forgets_to_send": (_forgets_to_send, ("deadlock", "rank 0 waiting in dist.recv"),
                        {"timeout": 8}),
    "not_done": (_not_done, "not implemented"),
}))
def test_check_naive_backward_accepts_reference_and_names_mistakes(answer, verdict):
    assert_check(lu.check_naive_backward, answer, verdict)
