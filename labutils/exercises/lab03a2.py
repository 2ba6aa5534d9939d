"""Exercise checker of lab 03a2: the message size at which Rabenseifner's halving-doubling
all-reduce overtakes recursive doubling. Registered in ``labutils.course``; the notebook calls
it as ``lu.check_crossover``."""
import math
import numbers
import sys

from labutils.core.i18n import tr
from labutils.cost.costmodel import allreduce_crossover
from labutils.exercises.base import CheckResult, call_learner, not_implemented, require_function


def crossover(p, alpha, beta):
    """Bytes at which halving-doubling and recursive doubling take equal time (p = 2^k >= 4)."""
    steps = math.log2(p)                  # rd: log2 p steps; hd: 2 log2 p, so hd pays log2 p more
    fewer_bytes = steps - 2 * (p - 1) / p  # rd sends log2 p n, hd 2 (p-1)/p n
    return steps * alpha / (fewer_bytes * beta)


_CASES = ((8, 5e-6, 8e-11), (4, 2e-3, 1e-8), (64, 2e-5, 1e-9), (16, 1e-4, 4e-10))


def _mistakes():
    """Typical wrong answers, (function, what is wrong), tried in this order."""
    L = math.log2
    return (
        (lambda p, a, b: 4 * a / b, tr("4 alpha / beta holds at p = 4 only: write it for any "
                                       "power of two p")),
        (lambda p, a, b: L(p) * b / ((L(p) - 2 * (p - 1) / p) * a),
         tr("alpha and beta are swapped: alpha is seconds per step, beta seconds per byte")),
        (lambda p, a, b: allreduce_crossover(p, a, b, "ring", "recursive_doubling"),
         tr("that is where the ring overtakes recursive doubling, not halving-doubling")),
        (lambda p, a, b: crossover(p, a, b) / 1024,
         tr("that is the size in KiB; return bytes")),
        (lambda p, a, b: a / b, tr("the byte terms differ by log2 p - 2 (p-1)/p times n beta, "
                                   "not by n beta")),
        (lambda p, a, b: 2 * crossover(p, a, b), tr("halving-doubling has 2 log2 p steps and "
                                                    "recursive doubling log2 p: they differ by "
                                                    "log2 p")),
    )


def _calls_library_crossover(fn, *args):
    """``fn(*args)`` and whether it called ``costmodel.allreduce_crossover`` (under any name):
    the exercise is to derive the formula, not to delegate to the library's."""
    target, seen, previous = allreduce_crossover.__code__, [], sys.getprofile()

    def watch(frame, event, arg):
        if event == "call" and frame.f_code is target:
            seen.append(True)
    sys.setprofile(watch)
    try:
        return fn(*args), bool(seen)
    finally:
        sys.setprofile(previous)


def check_crossover(learner_fn):
    """Check ``learner_fn(p, alpha, beta)``: the bytes at which halving-doubling's all-reduce
    time equals recursive doubling's, for several powers of two p (no processes needed)."""
    require_function("crossover", learner_fn)
    for number, (p, alpha, beta) in enumerate(_CASES, 1):
        where = tr("[wrong] {name}: case {number} of {total} ({case})", name="crossover",
                   number=number, total=len(_CASES), case=f"p={p}, alpha={alpha:g}, beta={beta:g}")
        traced, failed = call_learner("crossover", _calls_library_crossover, where, learner_fn,
                                      p, alpha, beta)
        if failed:
            return failed
        got, delegated = traced
        if got is None:
            return CheckResult(False, not_implemented("crossover"))
        if delegated:
            return CheckResult(False, tr("{where}: your function calls "
                                         "costmodel.allreduce_crossover; derive n yourself from "
                                         "the table of section 1", where=where), {"p": p})
        if not isinstance(got, numbers.Real) or isinstance(got, bool):
            return CheckResult(False, tr("{where}: expected a number of bytes, got {type} "
                                         "{got!r}", where=where, type=type(got).__name__,
                                         got=got), {"p": p})
        expected = allreduce_crossover(p, alpha, beta, "halving_doubling", "recursive_doubling")
        if math.isclose(float(got), expected, rel_tol=1e-6):
            continue
        why = next((text for wrong, text in _mistakes()
                    if math.isclose(float(got), wrong(p, alpha, beta), rel_tol=1e-6)), None)
        if why is None:
            why = tr("set the two times of the table in section 1 equal and solve for n")
        return CheckResult(False, f"{where}: " + tr("expected {e}, got {g}", e=f"{expected:.4g}",
                                                    g=f"{float(got):.4g}") + f": {why}",
                           {"p": p, "alpha": alpha, "beta": beta})
    return CheckResult(True, tr("[ok] {name}: {total} cases passed", name="crossover",
                                total=len(_CASES)))
