"""labutils.exercises.lab03a2: check_crossover accepts the closed form and rejects the typical
wrong answers with a message naming what is wrong (pure arithmetic: no processes)."""
import math

import pytest

from labutils.cost.costmodel import allreduce_crossover
from labutils.exercises import lab03a2 as X

from .checkers import assert_check, checker_cases

pytestmark = pytest.mark.lab03a2


def _stub(p, alpha, beta):
    return None  # FILL ME IN


def _raises(p, alpha, beta):
    raise NotImplementedError


@pytest.mark.parametrize("answer, verdict", checker_cases(X.crossover, {
    "p4_only": (lambda p, a, b: 4 * a / b, "p = 4 only"),
    "swapped": (lambda p, a, b: X.crossover(p, b, a), "swapped"),
    "ring": (lambda p, a, b: (2 * (p - 1) - math.log2(p)) * a
             / ((math.log2(p) - 2 * (p - 1) / p) * b), "ring"),
    # the right number, but delegated: the exercise is the derivation
    "library": (lambda p, a, b: allreduce_crossover(p, a, b, "halving_doubling",
                                                    "recursive_doubling"), "derive n yourself"),
    "library_ring": (lambda p, a, b: allreduce_crossover(p, a, b, "ring", "recursive_doubling"),
                     "calls costmodel.allreduce_crossover"),
    "kib": (lambda p, a, b: X.crossover(p, a, b) / 1024, "KiB"),
    "alpha_over_beta": (lambda p, a, b: a / b, "log2 p - 2 (p-1)/p"),
    "double_steps": (lambda p, a, b: 2 * X.crossover(p, a, b), "differ by log2 p"),
    "other": (lambda p, a, b: 123.0, ("expected", "solve for n")),
    "text": (lambda p, a, b: "1 MiB", "a number of bytes"),
    "stub": (_stub, "not implemented"),
    "raises": (_raises, "not implemented"),
}, passes="passed"))
def test_crossover_checker(answer, verdict):
    assert_check(X.check_crossover, answer, verdict)


def test_the_checker_leaves_no_profiler_behind():
    import sys
    X.check_crossover(X.crossover)
    assert sys.getprofile() is None


def test_the_reference_is_where_the_times_meet():
    from labutils.cost.costmodel import allreduce_time
    for p in (4, 8, 32):
        n = X.crossover(p, 1e-4, 1e-9)
        hd = allreduce_time(n, p, 1e-4, 1e-9, "halving_doubling")
        assert math.isclose(hd, allreduce_time(n, p, 1e-4, 1e-9, "recursive_doubling"))
