"""The 04c1 and 04c2 checkers need no processes: they pass the reference, and each typical
mistake gets its own message, never the answer."""
import pytest

import labutils as lu
from labutils.cost import costmodel
from labutils.cost.step_time import exposed_comm
from labutils.exercises import lab04c1, lab04c2


def _finish(ready, comm):
    free = 0.0
    for r, c in zip(ready, comm):
        free = max(free, r) + c
    return free


@pytest.mark.lab04c1
def test_exposed_comm_by_hand():
    # one thread: bucket 1 waits for bucket 0 (ends 0.5, then 0.9); bucket 2 fills at the end
    assert exposed_comm([0.1, 0.2, 1.0], [0.4, 0.4, 0.1], 1.0) == pytest.approx(0.1)
    assert exposed_comm([0.1, 0.2, 0.3, 1.0], [0.4] * 3 + [0.1], 1.0) == pytest.approx(0.4)
    assert exposed_comm([0.1], [0.3], 2.0) == 0.0
    with pytest.raises(ValueError):
        exposed_comm([0.1, 0.2], [0.3], 1.0)


@pytest.mark.lab04c1
@pytest.mark.parametrize("wrong, words", [
    (lambda r, c, e: sum(c), "none overlapped"),
    (lambda r, c, e: max(0.0, sum(c) - e), "cannot start before it is ready"),
    (lambda r, c, e: max(0.0, max(a + b for a, b in zip(r, c)) - e), "one at a time"),
    (lambda r, c, e: c[-1], "not always the last bucket"),
    (lambda r, c, e: _finish(r, c), "only for what runs after"),
    (lambda r, c, e: _finish(r, c) - e, "cannot be negative"),
    (lambda r, c, e: 0.5 * sum(c), "follow the thread"),
    (lambda r, c, e: "0.4", "expected seconds"),
])
def test_exposed_comm_checker_names_the_mistake(wrong, words):
    result = lu.check_exposed_comm(wrong)
    assert not result.passed and words in result.message


@pytest.mark.lab04c1
def test_exposed_comm_checker_passes_the_reference_and_refuses_a_non_function():
    assert lu.check_exposed_comm(lab04c1.exposed_comm).passed
    assert "not implemented" in lu.check_exposed_comm(lambda r, c, e: None).message
    with pytest.raises(TypeError, match="your function itself"):
        lu.check_exposed_comm(0.4)


@pytest.mark.lab04c2
@pytest.mark.parametrize("wrong, words", [
    (lambda n, t, p: n / t, "algorithm bandwidth"),
    (lambda n, t, p: n / t * p / (2 * (p - 1)), "divided by the factor"),
    (lambda n, t, p: n / t * (p - 1) / p, "reduce-scatter only"),
    (lambda n, t, p: n / t * 2 * (p - 1), "not all of it"),
    (lambda n, t, p: 8 * costmodel.bus_bandwidth(n, t, p), "bits per second"),
    (lambda n, t, p: n / t * 1.5, "count the bytes"),
])
def test_bus_bandwidth_checker_names_the_mistake(wrong, words):
    result = lu.check_bus_bandwidth(wrong)
    assert not result.passed and words in result.message
    assert "2 (p-1)/p" not in result.message   # the formula is never given away


@pytest.mark.lab04c2
def test_bus_bandwidth_checker_passes_the_reference():
    assert lu.check_bus_bandwidth(lab04c2.bus_bandwidth).passed
    assert lu.check_bus_bandwidth(costmodel.bus_bandwidth).passed


def test_call_learner_reports_unfinished_and_raising_functions():
    from labutils.exercises.base import call_learner
    assert call_learner("x", lambda a: a + 1, "here", 1) == (2, None)
    assert "not implemented" in call_learner("x", lambda: None, "here")[1].message

    def broken():
        raise ValueError("bad shape")
    got, failed = call_learner("x", broken, "here")
    assert got is None and not failed.passed
    assert "here" in failed.message and "ValueError" in failed.message and "bad shape" in failed.message
