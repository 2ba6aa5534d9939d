"""lab 03b's checker: ``check_stale_update`` accepts the reference, names each typical mistake."""
import pytest

import labutils as lu
from labutils.exercises import lab03b as exercises

from .checkers import assert_check, checker_cases

pytestmark = pytest.mark.lab03b


def _fresh(history, grad_fn, lr, staleness):
    return history[-1] - lr * grad_fn(history[-1])


def _rolls_back(history, grad_fn, lr, staleness):
    old = history[max(0, len(history) - 1 - staleness)]
    return old - lr * grad_fn(old)


def _off_by_one(history, grad_fn, lr, staleness):
    return history[-1] - lr * grad_fn(history[-staleness] if staleness else history[-1])


def _wraps_around(history, grad_fn, lr, staleness):
    return history[-1] - lr * grad_fn(history[len(history) - 1 - staleness])


def _stub(history, grad_fn, lr, staleness):
    raise NotImplementedError  # FILL ME IN


@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(exercises.stale_update, {
    "fresh": (_fresh, ("expected", "synchronous SGD, staleness 0")),
    "rolls_back": (_rolls_back, "applied to the stale weights"),
    "off_by_one": (_off_by_one, "off by one"),
    "wraps_around": (_wraps_around, "negative index wraps around"),
    "stub": (_stub, "not implemented"),
}, passes="6 cases passed"))
def test_stale_update_checker(answer, verdict):
    assert_check(lu.check_stale_update, answer, verdict)
