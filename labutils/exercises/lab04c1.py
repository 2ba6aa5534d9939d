"""Exercise checker of lab 04c1: the communication a step waits for after backward, when one
thread runs the buckets' all-reduces in order. Registered in ``labutils.course``; the notebook
calls it as ``lu.check_exposed_comm``.

The checker needs no processes: the bucket timings are arguments. The cases are ordered so
that each typical mistake fails first on a case where no other mistake gives its number."""
import math
import numbers
from functools import reduce

from labutils.core.i18n import tr
from labutils.cost.step_time import exposed_comm   # the reference: lu.show_solution("exposed_comm")
from labutils.exercises.base import CheckResult, call_learner, require_function

# (ready, comm, backward_end), in seconds
_CASES = (
    ((0.0, 0.9), (0.2, 0.3), 1.0),                       # the last bucket fills before the end
    ((0.1, 0.2, 0.3, 1.0), (0.4, 0.4, 0.4, 0.1), 1.0),   # a queue builds behind bucket 0
    ((0.1, 0.2), (0.3, 0.2), 2.0),                       # everything hidden
    ((0.4,), (0.5,), 0.4),                               # one bucket, ready at backward's end
)


def _finish(ready, comm):
    return reduce(lambda free, rc: max(free, rc[0]) + rc[1], zip(ready, comm), 0.0)


def _mistakes():
    """Typical wrong answers, (function, what is wrong), tried in this order."""
    return (
        (lambda r, c, e: sum(c), tr("that is every all-reduce, as if none overlapped backward "
                                    "(the buckets launched after backward)")),
        (lambda r, c, e: max(0.0, sum(c) - e), tr("that hides the communication behind all of "
                                                  "backward; a bucket cannot start before it "
                                                  "is ready")),
        (lambda r, c, e: max(0.0, max(a + b for a, b in zip(r, c)) - e),
         tr("that lets the buckets run side by side; one thread runs them one at a time, so a "
            "bucket may wait for the one before it")),
        (lambda r, c, e: c[-1], tr("not always the last bucket's all-reduce: it may wait for "
                                   "earlier ones, or finish before backward ends")),
        (lambda r, c, e: _finish(r, c), tr("that is when the last bucket finishes; the step "
                                           "waits only for what runs after backward's end")),
        (lambda r, c, e: _finish(r, c) - e, tr("a wait cannot be negative: communication that "
                                               "ended before backward did costs nothing")),
    )


def check_exposed_comm(learner_fn):
    """Check ``learner_fn(ready, comm, backward_end) -> seconds``: how long a step waits after
    backward for buckets run in order by one communication thread."""
    require_function("exposed_comm", learner_fn)
    for number, (ready, comm, end) in enumerate(_CASES, 1):
        where = tr("[wrong] {name}: case {number} of {total} ({case})", name="exposed_comm",
                   number=number, total=len(_CASES),
                   case=f"ready={list(ready)}, comm={list(comm)}, backward_end={end}")
        got, failed = call_learner("exposed_comm", learner_fn, where, list(ready), list(comm), end)
        if failed:
            return failed
        if not isinstance(got, numbers.Real) or isinstance(got, bool):
            return CheckResult(False, tr("{where}: expected seconds (a number), got {type} "
                                         "{got!r}", where=where, type=type(got).__name__,
                                         got=got))
        if math.isclose(float(got), exposed_comm(ready, comm, end), abs_tol=1e-9):
            continue
        why = next((text for wrong, text in _mistakes()
                    if math.isclose(float(got), wrong(ready, comm, end), abs_tol=1e-9)), None)
        if why is None:
            why = tr("follow the thread: each bucket starts when it is ready and the bucket "
                     "before it has finished")
        return CheckResult(False, f"{where}: {why}")
    return CheckResult(True, tr("[ok] {name}: {total} cases passed", name="exposed_comm",
                                total=len(_CASES)))
