"""Exercise checkers: run the learner's function on real ranks and name the first difference.

Used by the exercises at the end of most labs (first in ``03a1_collectives_and_ring``); each lab's
module defines its ``check_<name>`` with :func:`run_check`, and ``lu.check_<name>(my_fn)`` finds
it. A checker never raises for a wrong answer: it returns a :class:`CheckResult` whose text is
one line (shown once as the cell's output), so a notebook that checks an unfilled stub stores no
error and compares under nbval.

A checker is three pieces::

    def _average_gradients_harness(rank, world_size, learner_fn, seed):   # runs on every rank
        ...build inputs from seed, compute the single-process reference...
        return expected, got                                               # compared per rank

    def check_average_gradients(learner_fn):
        return run_check("average_gradients", learner_fn, _average_gradients_harness,
                         make_cases(world_sizes=(2, 3, 4)))

The worked example (``average_gradients``, the core of DDP, in ``lab04a.py``) is the one the
tests use.
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field

import torch

from labutils.core.errors import LaunchTimeout, WorkerError
from labutils.core.i18n import language, set_language, tr
from labutils.core.launcher import launch

FILL_ME_IN = "fill in the lines marked # FILL ME IN"   # English; messages use fill_me_in()
_RESERVED = {"world_size", "backend", "timeout", "threads_per_rank", "warn_oversubscription"}


def fill_me_in():
    """What to do with an unfilled stub, in the current language."""
    return tr("fill in the lines marked # FILL ME IN")


def not_implemented(name):
    """The message of a check whose function still raises NotImplementedError."""
    return tr("[to do] {name}: not implemented yet; {todo}", name=name, todo=fill_me_in())


# ----------------------------------------------------------------------------------------
# First difference, in words.

def _num(x, digits=3):
    """A number as the learner would write it: 6.0, 0.1, 3. Three significant digits: enough to
    see a wrong answer, and the same on every CPU (the last digits of computed floats are not)."""
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return repr(float(f"{x:.{digits}g}"))


def _expected_got(expected, got):
    """'expected E, got G' with three significant digits, more only where three would print
    two equal numbers for a difference the check still rejects."""
    for digits in range(3, 10):
        e, g = _num(expected, digits), _num(got, digits)
        if e != g:
            break
    return tr("expected {e}, got {g}", e=e, g=g)


def _short(x, limit=60):
    """``repr(x)``, cut at ``limit`` characters unless it is a string: a string is a diagnosis
    (where a deadlock stopped, which mistake), and its end is what the student needs."""
    text = repr(x)
    return text if isinstance(x, str) or len(text) <= limit else text[:limit - 3] + "..."


def _kind(x):
    if isinstance(x, torch.Tensor):
        return tr("a tensor of shape {shape}", shape=list(x.shape))
    if x is None:
        return "None"
    if isinstance(x, (list, tuple, dict)):
        if len(x) == 1:
            return tr("a {type} of 1 item", type=type(x).__name__)
        return tr("a {type} of {n} items", type=type(x).__name__, n=len(x))
    return f"{type(x).__name__} {_short(x)}"


def _is_number(x):
    return isinstance(x, (int, float)) or (hasattr(x, "dtype") and getattr(x, "shape", 1) == ()
                                           and not isinstance(x, torch.Tensor))


def _tensor_difference(expected, got, atol, rtol):
    if list(expected.shape) != list(got.shape):
        return tr("shape: expected {e}, got {g}", e=list(expected.shape), g=list(got.shape))
    if expected.dtype != got.dtype:
        return tr("dtype: expected {e}, got {g}", e=expected.dtype, g=got.dtype)
    e, g = expected.detach().cpu(), got.detach().cpu()
    if e.is_floating_point() or e.is_complex():
        same = torch.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    else:
        same = g == e
    if bool(same.all()):
        return None
    if e.dim() == 0:
        return tr("value: {diff}", diff=_expected_got(e.item(), g.item()))
    index = [int(i) for i in (~same).nonzero()[0]]
    where = tuple(index)
    return tr("element {index}: {diff}", index=index,
              diff=_expected_got(e[where].item(), g[where].item()))


def first_difference(expected, got, *, atol=1e-5, rtol=1e-4):
    """None when ``got`` equals ``expected`` (tensors within tolerance); else the first
    difference in words, e.g. ``"for 'weight', element [2, 3]: expected 6.0, got 3.0"``."""
    if type(expected).__module__ == "numpy" and hasattr(expected, "shape") and expected.shape:
        expected = torch.as_tensor(expected)
        if type(got).__module__ == "numpy" and hasattr(got, "shape"):
            got = torch.as_tensor(got)
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return tr("expected {e}, got {g}", e=_kind(expected), g=_kind(got))
        return _tensor_difference(expected, got, atol, rtol)
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return tr("expected {e}, got {g}", e=_kind(expected), g=_kind(got))
        missing = [k for k in expected if k not in got]
        if missing:
            return tr("missing key {key!r}", key=missing[0])
        extra = [k for k in got if k not in expected]
        if extra:
            return tr("unexpected key {key!r}", key=extra[0])
        for key in expected:
            diff = first_difference(expected[key], got[key], atol=atol, rtol=rtol)
            if diff is not None:
                return tr("for {key!r}, {diff}", key=key, diff=diff)
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return tr("expected {e}, got {g}", e=_kind(expected), g=_kind(got))
        if len(expected) != len(got):
            return tr("length: expected {e} items, got {g}", e=len(expected), g=len(got))
        for i, (e, g) in enumerate(zip(expected, got)):
            diff = first_difference(e, g, atol=atol, rtol=rtol)
            if diff is not None:
                return tr("item {i}: {diff}", i=i, diff=diff)
        return None
    if _is_number(expected) and not isinstance(expected, bool):
        if isinstance(got, torch.Tensor) and got.dim() == 0:
            got = got.item()
        if not _is_number(got) or isinstance(got, bool):
            return tr("expected a number ({e}), got {g}", e=_num(expected), g=_kind(got))
        e, g = float(expected), float(got)
        if (math.isnan(e) and math.isnan(g)) or abs(g - e) <= atol + rtol * abs(e):
            return None
        return _expected_got(expected, got)
    if expected != got:
        return tr("expected {e}, got {g}", e=_short(expected), g=_short(got))
    return None


# ----------------------------------------------------------------------------------------
# Running a check.

@dataclass(frozen=True)
class CheckResult:
    """The outcome of a check; shown (repr, str, notebook) as its one-line ``message``."""
    passed: bool
    message: str
    case: dict | None = field(default=None)  # the failing case; None: all passed, or a stub

    def __str__(self):
        return self.message

    __repr__ = __str__

    def _repr_pretty_(self, p, cycle):
        p.text(self.message)


def make_cases(world_sizes=(2, 3, 4), per_world_size=2, seed=0, **choices):
    """Deterministic cases: for each world size, ``per_world_size`` cases, each with a
    ``seed`` and one value drawn from every ``choices`` list (``n=[5, 7, 8]``)."""
    rng = random.Random(seed)
    cases = []
    for world_size in world_sizes:
        for _ in range(per_world_size):
            case = {"world_size": world_size}
            case.update({name: rng.choice(list(options)) for name, options in choices.items()})
            case["seed"] = rng.randrange(10_000)
            cases.append(case)
    return cases


def _describe_case(case):
    return ", ".join(f"{k}={_short(v, 30)}" for k, v in case.items())


def require_function(name, learner_fn):
    """Every checker's first check: it was given the learner's function, not its result."""
    if not callable(learner_fn):
        raise TypeError(tr("check_{name} needs your function itself, e.g. "
                           "lu.check_{name}(my_{name}) (no parentheses after it); got {type}",
                           name=name, type=type(learner_fn).__name__))


def call_learner(name, learner_fn, where, *args):
    """Call the learner's function in this process (the checkers that need no ranks):
    ``(result, None)``, or ``(None, CheckResult)`` when it is not implemented yet (raises
    NotImplementedError or returns None) or raised anything else."""
    try:
        got = learner_fn(*args)
    except NotImplementedError:
        return None, CheckResult(False, not_implemented(name))
    except Exception as e:   # noqa: BLE001 (report any error as the learner's)
        return None, CheckResult(False, tr("{where}: raised {error}: {message}", where=where,
                                           error=type(e).__name__, message=e))
    if got is None:
        return None, CheckResult(False, not_implemented(name))
    return got, None


def _validate(name, learner_fn, harness, cases):
    require_function(name, learner_fn)
    if not callable(harness):
        raise TypeError(f"harness must be a function harness(rank, world_size, learner_fn, "
                        f"**case); got {type(harness).__name__}")
    if not cases:
        raise ValueError("cases must be a non-empty list of dicts with a 'world_size' key")
    for case in cases:
        if not isinstance(case, dict) or not isinstance(case.get("world_size"), int):
            raise ValueError(f"every case must be a dict with an int 'world_size'; got {case!r}")
        clash = (set(case) & _RESERVED) - {"world_size"}
        if clash:
            raise ValueError(f"case keys {sorted(clash)} are lu.launch arguments; rename them")


def _describe_error(e):
    """'rank 1 raised ValueError: msg' from WorkerError's 'rank 1: ValueError: msg'."""
    text = str(e).strip()
    lines = text.splitlines()
    text = "\n".join(lines[:6]) + ("\n..." if len(lines) > 6 else "")
    m = re.match(r"rank (\d+): (\w+(?:\.\w+)*): (.*)\Z", text, re.S)
    if m:
        return tr("rank {rank} raised {error}: {message}", rank=m.group(1), error=m.group(2),
                  message=m.group(3))
    m = re.match(r"rank (\d+): (\w+(?:\.\w+)*)\Z", text)
    if m:
        return tr("rank {rank} raised {error}", rank=m.group(1), error=m.group(2))
    return text


def _not_implemented(e):
    return re.match(r"rank \d+: NotImplementedError\b", str(e)) is not None


def _in_language(rank, world_size, lang, harness, learner_fn, **case):
    """A harness on a rank, writing its words in the caller's language: the rank forked from a
    forkserver started before the notebook's ``set_language``, so the language comes along."""
    set_language(lang)
    return harness(rank, world_size, learner_fn, **case)


def run_check(name, learner_fn, harness, cases, *, timeout=20.0, atol=1e-5, rtol=1e-4):
    """Run ``harness(rank, world_size, learner_fn, **case)`` on real ranks for each case; each
    rank returns ``(expected, got)``. Stops at the first failing case. Never raises for a
    wrong answer; returns a :class:`CheckResult`."""
    _validate(name, learner_fn, harness, cases)
    total = len(cases)
    for number, case in enumerate(cases, 1):
        kwargs = {k: v for k, v in case.items() if k != "world_size"}
        where = tr("[wrong] {name}: case {number} of {total} ({case})", name=name,
                   number=number, total=total, case=_describe_case(case))
        try:
            # 4 ranks on a 2-core laptop are fine for a correctness check; the warning would
            # also put the machine's core count into the notebook's output.
            pairs = launch(_in_language, language(), harness, learner_fn,
                           world_size=case["world_size"], timeout=timeout,
                           threads_per_rank=1, warn_oversubscription=False, **kwargs)
        except LaunchTimeout as e:
            stuck = "; ".join(e.stuck)
            return CheckResult(False, tr("{where}: did not finish in {timeout:g} s "
                                         "(deadlock?): {stuck}", where=where, timeout=timeout,
                                         stuck=stuck), case)
        except WorkerError as e:
            if _not_implemented(e):
                return CheckResult(False, not_implemented(name))  # no case failed: none ran
            return CheckResult(False, f"{where}: {_describe_error(e)}", case)
        for rank, (expected, got) in enumerate(pairs):
            diff = first_difference(expected, got, atol=atol, rtol=rtol)
            if diff is not None:
                return CheckResult(False, tr("{where}: rank {rank}, {diff}", where=where,
                                             rank=rank, diff=diff), case)
    sizes = ", ".join(map(str, sorted({case["world_size"] for case in cases})))
    cases_passed = (tr("1 case passed") if total == 1 else
                    tr("{total} cases passed", total=total))
    if "," in sizes:
        return CheckResult(True, tr("[ok] {name}: {passed} (world sizes {sizes})", name=name,
                                    passed=cases_passed, sizes=sizes))
    return CheckResult(True, tr("[ok] {name}: {passed} (world size {sizes})", name=name,
                                passed=cases_passed, sizes=sizes))
