"""The one pattern behind every exercise checker's tests: ``lu.check_<name>`` accepts the
reference solution and rejects each typical mistake with a message naming what is wrong.

    @pytest.mark.slow          # a checker runs the answer on real ranks
    @pytest.mark.parametrize("answer, verdict", checker_cases(C.ring_all_reduce, {
        "reduce_scatter_only": (_reduce_scatter_only, ("rank", "expected")),
        "deadlock": (_forgets_to_send, "deadlock", {"timeout": 8}),
        "stub": (_stub, "not implemented"),
    }, passes="passed"))
    def test_ring_all_reduce_checker(answer, verdict):
        assert_check(lu.check_ring_all_reduce, answer, verdict)

Every answer is one test (id ``reference``, then the dict's keys), and one run of the checker.
What a message must say (``words``, or ``passes`` for the right answers) is one or a tuple of:

* ``str``: occurs in the message, as plain text (messages are full of ``[ ] ( )``);
* ``re.Pattern``: ``re.search`` finds it in the message; :func:`exactly` and
  :func:`starts_with` build the two common ones;
* a function: called with the :class:`CheckResult`, returns true (its docstring says what it
  checks), e.g. for ``result.case``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import torch


@dataclass(frozen=True)
class Verdict:
    """What the checker must answer for one answer: pass or fail, saying ``words``."""
    passed: bool
    words: tuple = ()
    checker_kwargs: tuple = ()   # (name, value) pairs passed to the checker, e.g. timeout

    def __repr__(self):
        kwargs = "".join(f", {k}={v!r}" for k, v in self.checker_kwargs)
        return f"{'passes' if self.passed else 'fails'}{kwargs}, saying {self.words!r}"


def _words(words):
    return tuple(words) if isinstance(words, (tuple, list)) else (words,)


def exactly(text):
    """A pattern for a message that is ``text`` and nothing else."""
    return re.compile(r"\A" + re.escape(text) + r"\Z")


def starts_with(text):
    """A pattern for a message that begins with ``text``."""
    return re.compile(r"\A" + re.escape(text))


def checker_cases(reference, wrong_answers, *, passes=(), also_right=None):
    """pytest params ``(answer, verdict)`` for :func:`assert_check`: the ``reference`` (id
    ``reference``) and every function of ``also_right`` (name -> function) must pass, their
    message saying ``passes``; every entry of ``wrong_answers``, name -> ``(answer, words)`` or
    ``(answer, words, checker_kwargs)``, must fail with a message saying ``words``."""
    right = {"reference": reference, **(also_right or {})}
    params = [pytest.param(answer, Verdict(True, _words(passes)), id=name)
              for name, answer in right.items()]
    for name, spec in wrong_answers.items():
        if len(spec) not in (2, 3):
            raise ValueError(f"wrong answer {name!r}: expected (answer, words) or "
                             f"(answer, words, checker_kwargs), got {spec!r}")
        answer, words, kwargs = (*spec, {})[:3]
        if not callable(answer):
            raise TypeError(f"wrong answer {name!r}: {answer!r} is not a function")
        params.append(pytest.param(answer, Verdict(False, _words(words),
                                                   tuple(sorted(kwargs.items()))), id=name))
    if len({p.id for p in params}) != len(params):
        raise ValueError(f"answer names must be unique: {[p.id for p in params]}")
    return params


def _assert_says(result, want):
    if isinstance(want, str):
        assert want in result.message, f"{want!r} is not in the message: {result.message}"
    elif isinstance(want, re.Pattern):
        assert want.search(result.message), \
            f"{want.pattern!r} does not match the message: {result.message}"
    elif callable(want):
        what = (want.__doc__ or want.__name__).strip()
        assert want(result), f"{what}: not so in {result!r} (case {result.case!r})"
    else:
        raise TypeError(f"expected words: a str, a re.Pattern or a function; got {want!r}")


def assert_check(checker, answer, verdict):
    """Run ``checker(answer)`` and assert it answers ``verdict``: passed (and names no failing
    case) or failed, its message saying every one of ``verdict.words``. Returns the result."""
    result = checker(answer, **dict(verdict.checker_kwargs))
    if verdict.passed:
        assert result.passed, f"the checker rejects a right answer: {result.message}"
        assert result.case is None, f"a passed check names a failing case: {result.case!r}"
    else:
        assert not result.passed, f"the checker accepts a wrong answer: {result.message}"
    for want in verdict.words:
        _assert_says(result, want)
    return result


def square_function(backward):
    """Lab 02's exercise answered with ``backward(x, grad_output)``: a custom autograd square
    whose forward is right, for the checker's tests (English and Chinese) to feed it wrong
    gradients."""
    class Attempt(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 2

        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            return backward(x, grad_output)
    return Attempt
