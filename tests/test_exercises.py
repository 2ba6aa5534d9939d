"""lu.exercises: first_difference in words (no processes), and run_check on real ranks through
the worked example check_average_gradients: accepts the reference, rejects typical wrong
answers with a message naming case, rank and element, catches a deadlock by its timeout."""

import numpy as np
import pytest
import torch
import torch.distributed as dist

import labutils as lu
from labutils.exercises import lab04a as exercises
from labutils.exercises.base import CheckResult, first_difference, make_cases, run_check

pytestmark = [pytest.mark.lab04a]


# ---- learner answers, right and wrong ---------------------------------------------------

def missing_division(model, world_size):
    for param in model.parameters():
        dist.all_reduce(param.grad)  # a sum, not a mean


def skips_all_reduce(model, world_size):
    for param in model.parameters():
        param.grad /= world_size  # every rank keeps its own gradient


def stub(model, world_size):
    # FILL ME IN
    raise NotImplementedError


def raises_on_rank_1(model, world_size):
    if dist.get_rank() == 1:
        raise ValueError("shapes do not match")
    exercises.average_gradients(model, world_size)


def deadlocking_send_order(model, world_size):
    rank = dist.get_rank()
    for param in model.parameters():
        dist.recv(param.grad, src=(rank + 1) % world_size)  # everyone receives first
        dist.send(param.grad, dst=(rank - 1) % world_size)


# ---- first_difference -------------------------------------------------------------------

def test_equal_values_have_no_difference():
    a = torch.arange(12.0).reshape(3, 4)
    assert first_difference(a, a.clone()) is None
    assert first_difference(a, a + 1e-7) is None
    assert first_difference({"w": [a, 1.5]}, {"w": (a.clone(), 1.5)}) is None
    assert first_difference(torch.tensor([float("nan")]), torch.tensor([float("nan")])) is None


def test_first_differing_tensor_element_is_named():
    a = torch.arange(12.0).reshape(3, 4)
    b = a.clone()
    b[2, 3], b[2, 1] = 3.0, 0.0
    assert first_difference(a, b) == "element [2, 1]: expected 9.0, got 0.0"
    assert first_difference(torch.tensor(2.5), torch.tensor(0.5)) == "value: expected 2.5, got 0.5"


def test_shape_dtype_and_type_mismatches_are_named():
    a = torch.zeros(3, 4)
    assert first_difference(a, torch.zeros(4, 3)) == "shape: expected [3, 4], got [4, 3]"
    assert first_difference(a, a.double()) == "dtype: expected torch.float32, got torch.float64"
    assert first_difference(a, None) == "expected a tensor of shape [3, 4], got None"
    assert first_difference(np.ones(3), np.array([1.0, 2.0, 1.0])) == \
        "element [1]: expected 1.0, got 2.0"


def test_nested_containers_and_numbers():
    a = torch.ones(2)
    assert first_difference({"weight": a, "bias": a}, {"weight": a, "bias": a * 2}) == \
        "key 'bias': element [0]: expected 1.0, got 2.0"
    assert first_difference({"weight": a}, {}) == "missing key 'weight'"
    assert first_difference([1, 2, 3.0], [1, 2, 3.5]) == "item 2: expected 3.0, got 3.5"
    assert first_difference([1, 2], [1, 2, 3]) == "length: expected 2 items, got 3"
    assert first_difference(1.0, 1.0 + 1e-9) is None
    assert first_difference(7, "7") == "expected a number (7), got str '7'"
    assert first_difference("ring", "tree") == "expected 'ring', got 'tree'"


def test_tolerances_are_used():
    assert first_difference(100.0, 100.5) is not None
    assert first_difference(100.0, 100.5, rtol=1e-2) is None
    assert first_difference(torch.zeros(2), torch.full((2,), 0.01), atol=0.1) is None


def test_make_cases_is_deterministic_and_covers_world_sizes():
    cases = make_cases(world_sizes=(2, 3), per_world_size=2, seed=1, n=[5, 7])
    assert cases == make_cases(world_sizes=(2, 3), per_world_size=2, seed=1, n=[5, 7])
    assert [c["world_size"] for c in cases] == [2, 2, 3, 3]
    assert all(c["n"] in (5, 7) and isinstance(c["seed"], int) for c in cases)


def test_check_result_shows_its_message():
    result = CheckResult(False, "[wrong] x: case 1 of 1 (world_size=2): rank 0, element [0]: ...")
    assert repr(result) == str(result) == result.message
    from IPython.lib.pretty import pretty
    assert pretty(result) == result.message


def test_bad_input_is_refused_before_any_process_starts(monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a process was started")
    monkeypatch.setattr(lu.exercises.base, "launch", no_launch)
    with pytest.raises(TypeError, match=r"lu.check_average_gradients\(my_average_gradients\)"):
        exercises.check_average_gradients(None)
    with pytest.raises(TypeError, match="your function itself"):
        exercises.check_average_gradients(3)
    with pytest.raises(ValueError, match="non-empty"):
        run_check("x", stub, exercises._average_gradients_harness, [])
    with pytest.raises(ValueError, match="int 'world_size'"):
        run_check("x", stub, exercises._average_gradients_harness, [{"n": 3}])
    with pytest.raises(ValueError, match="lu.launch arguments"):
        run_check("x", stub, exercises._average_gradients_harness,
                  [{"world_size": 2, "timeout": 3}])


# ---- run_check on real ranks ------------------------------------------------------------

@pytest.mark.slow
def test_accepts_the_reference():
    result = exercises.check_average_gradients(exercises.average_gradients)
    assert result.passed and result.case is None
    assert result.message == "[ok] average_gradients: 3 cases passed (world sizes 2, 3, 4)"


@pytest.mark.slow
def test_lu_finds_the_checker():
    assert lu.check_average_gradients is exercises.check_average_gradients


@pytest.mark.slow
@pytest.mark.parametrize("wrong", [missing_division, skips_all_reduce])
def test_rejects_wrong_averages_naming_case_rank_and_element(wrong):
    result = exercises.check_average_gradients(wrong)
    assert not result.passed
    assert result.case == {"world_size": 2, "n": 3, "seed": 4969}
    assert result.message.startswith(
        "[wrong] average_gradients: case 1 of 3 (world_size=2, n=3, seed=4969): rank 0, "
        "key '0.weight': element [0, 0]: expected -0.0352, got ")
    got = float(result.message.rsplit("got ", 1)[1])
    assert got != pytest.approx(-0.0352, abs=1e-4)


@pytest.mark.slow
def test_learner_exception_names_rank_and_message():
    result = exercises.check_average_gradients(raises_on_rank_1)
    assert not result.passed
    assert result.message == ("[wrong] average_gradients: case 1 of 3 (world_size=2, n=3, seed=4969): "
                              "rank 1 raised ValueError: shapes do not match")


@pytest.mark.slow
def test_unfilled_stub_says_fill_me_in():
    result = exercises.check_average_gradients(stub)
    assert not result.passed
    assert result.message == ("[to do] average_gradients: not implemented yet; fill in the lines "
                              "marked # FILL ME IN")


@pytest.mark.slow
def test_deadlock_is_caught_by_the_timeout_naming_the_ranks():
    result = exercises.check_average_gradients(deadlocking_send_order, timeout=5)
    assert not result.passed
    assert result.message.startswith("[wrong] average_gradients: case 1 of 3 (world_size=2, n=3, "
                                     "seed=4969): did not finish in 5 s (deadlock?): ")
    assert "rank 0 waiting in dist.recv" in result.message
    assert "rank 1 waiting in dist.recv" in result.message
    assert "of deadlocking_send_order" in result.message


@pytest.mark.slow
def test_later_case_failure_is_reported_with_its_number():
    # Right on 2 ranks only: the first case passes and the second one is the one reported.
    cases = [{"world_size": 2, "seed": 1, "n": 3}, {"world_size": 3, "seed": 2, "n": 4}]

    def harness(rank, world_size, learner_fn, seed, n):
        expected, got = exercises._average_gradients_harness(rank, world_size, learner_fn,
                                                              seed, n)
        return expected, (got if world_size == 2 else {k: v * 0 for k, v in got.items()})

    result = run_check("avg", exercises.average_gradients, harness, cases)
    assert not result.passed and result.case == cases[1]
    assert result.message.startswith("[wrong] avg: case 2 of 2 (world_size=3, seed=2, n=4): rank 0, ")


def test_differences_show_three_digits_and_more_only_when_needed():
    assert first_difference(0.2671453, 0.2352561) == "expected 0.267, got 0.235"
    # a difference the tolerance rejects, invisible at three digits, gets the digits it needs
    assert first_difference(1.0, 1.0013) == "expected 1.0, got 1.001"
