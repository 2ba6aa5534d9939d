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

from .checkers import assert_check, checker_cases, exactly, starts_with

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
        "for 'bias', element [0]: expected 1.0, got 2.0"
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
def test_lu_finds_the_checker():
    assert lu.check_average_gradients is exercises.check_average_gradients


FIRST_CASE = "case 1 of 3 (world_size=2, n=3, seed=4969)"


def _names_the_first_case(result):
    """result.case is the first case, {'world_size': 2, 'n': 3, 'seed': 4969}"""
    return result.case == {"world_size": 2, "n": 3, "seed": 4969}


def _names_no_case(result):
    """result.case is None: a stub fails no case (03a's and 03b's hints key on this)"""
    return result.case is None


def _got_is_not_the_mean(result):
    """the number after 'got' is not the expected mean -0.0352"""
    got = float(result.message.rsplit("got ", 1)[1])
    return got != pytest.approx(-0.0352, abs=1e-4)


WRONG_AVERAGE = (  # names case, rank and element
    _names_the_first_case,
    starts_with(f"[wrong] average_gradients: {FIRST_CASE}: rank 0, "
                "for '0.weight', element [0, 0]: expected -0.0352, got "),
    _got_is_not_the_mean,
)


@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(exercises.average_gradients, {
    # wrong averages: the message names case, rank and element
    "missing_division": (missing_division, WRONG_AVERAGE),
    "skips_all_reduce": (skips_all_reduce, WRONG_AVERAGE),
    # a learner's exception: names the rank and the message
    "raises_on_rank_1": (raises_on_rank_1, exactly(
        f"[wrong] average_gradients: {FIRST_CASE}: rank 1 raised ValueError: shapes do not match")),
    # an unfilled stub says fill me in
    "stub": (stub, (exactly("[to do] average_gradients: not implemented yet; fill in the lines "
                            "marked # FILL ME IN"), _names_no_case)),
    # a deadlock is caught by the timeout, naming the ranks and where they wait
    "deadlocking_send_order": (deadlocking_send_order, (
        starts_with(f"[wrong] average_gradients: {FIRST_CASE}: did not finish in 10 s "
                    "(deadlock?): "),
        "rank 0 waiting in dist.recv", "rank 1 waiting in dist.recv",
        "of deadlocking_send_order"), {"timeout": 10}),
}, passes=exactly("[ok] average_gradients: 3 cases passed (world sizes 2, 3, 4)")))
def test_check_average_gradients(answer, verdict):
    assert_check(exercises.check_average_gradients, answer, verdict)


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


def test_the_checker_test_helper_fails_when_the_checker_is_wrong():
    """tests/checkers.py, used by every checker's test, is not vacuous (no process here)."""
    def fake_checker(answer, **kwargs):   # an answer here returns the checker's result
        return answer(**kwargs)
    ok = CheckResult(True, "[ok] x: 2 cases passed (world size 2)")
    wrong = CheckResult(False, "[wrong] x: case 1 of 2 (world_size=2): rank 0, expected 1.0, "
                               "got 2.0", {"world_size": 2})

    def right_answer():
        return ok

    def wrong_answer(timeout=20.0):
        assert timeout == 5
        return wrong

    def params(words):
        return checker_cases(right_answer, {"sum": (wrong_answer, words, {"timeout": 5})},
                             passes="passed")

    right, sum_ = params(("rank 0", "expected"))
    assert [right.id, sum_.id] == ["reference", "sum"]
    assert assert_check(fake_checker, *right.values) is ok
    assert assert_check(fake_checker, *sum_.values) is wrong
    # a right answer rejected, a wrong one accepted, a passed check naming a case: all fail
    for answer, verdict in [(lambda: wrong, right.values[1]), (lambda timeout: ok, sum_.values[1]),
                            (lambda: CheckResult(True, "[ok] x passed", {}), right.values[1])]:
        with pytest.raises(AssertionError):
            assert_check(fake_checker, answer, verdict)
    # every kind of expected words that the message does not say: fails
    for words in ["rank 1", ("rank 0", "expected 2.0"), starts_with("expected"),
                  exactly("[wrong] x"), lambda result: result.case is None]:
        _, sum_ = params(words)
        with pytest.raises(AssertionError):
            assert_check(fake_checker, *sum_.values)
    with pytest.raises(AssertionError):
        assert_check(fake_checker, *checker_cases(right_answer, {}, passes="failed")[0].values)
    with pytest.raises(ValueError, match="unique"):
        checker_cases(right_answer, {"reference": (wrong_answer, "x")})


def test_a_string_diagnosis_is_never_cut_but_a_long_list_is():
    from labutils.exercises.base import first_difference
    where = "deadlock: rank 0 at B0 of stage 0, rank 1 at F1 of stage 1, both waiting to receive"
    message = first_difference("no deadlock", where)
    assert where in message and "..." not in message
    assert first_difference({1, 2}, set(range(40))).endswith("16...")   # a long repr is cut
