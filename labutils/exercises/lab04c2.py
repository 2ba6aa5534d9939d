"""Exercise checker of lab 04c2: an all-reduce's bus bandwidth. Registered in
``labutils.course``; the notebook calls it as ``lu.check_bus_bandwidth``.

The checker needs no processes: ``world_size`` is an argument, so it tries world sizes
where the typical mistakes give different numbers (at p = 2 the bus bandwidth equals the
algorithm bandwidth, so p = 2 alone would pass a wrong answer)."""
import math
import numbers

from labutils.core.i18n import tr
from labutils.cost import costmodel
from labutils.exercises.base import CheckResult, call_learner, require_function

# (bytes, seconds, world size): p = 2 last, after the sizes that tell the mistakes apart
_CASES = ((64 << 20, 0.125, 4), (1 << 20, 3e-3, 3), (16 << 20, 0.02, 8), (1 << 10, 1e-4, 2))


def _mistakes():
    """Typical wrong answers, (function, what is wrong), tried in this order."""
    return (
        (lambda n, t, p: n / t, tr("that is the algorithm bandwidth (size / time): in a ring "
                                   "all-reduce each rank's link carries more than the tensor "
                                   "once; count what it sends")),
        (lambda n, t, p: n / t * p / (2 * (p - 1)), tr("you divided by the factor instead of "
                                                        "multiplying: a ring moves more bytes "
                                                        "than the tensor, so bus bandwidth is "
                                                        "at least the algorithm bandwidth")),
        (lambda n, t, p: n / t * (p - 1) / p, tr("that counts the reduce-scatter only: an "
                                                 "all-reduce is a reduce-scatter and an "
                                                 "all-gather")),
        (lambda n, t, p: n / t * 2 * (p - 1), tr("each of the 2 (p-1) steps carries 1/p of the "
                                                 "tensor, not all of it")),
        (lambda n, t, p: 8 * n / t * 2 * (p - 1) / p, tr("that is bits per second; return "
                                                         "bytes per second")),
    )


def check_bus_bandwidth(learner_fn):
    """Check ``learner_fn(nbytes, seconds, world_size) -> bytes/s``: an all-reduce's bus
    bandwidth, the figure comparable across world sizes and with a link's speed."""
    require_function("bus_bandwidth", learner_fn)
    for number, (n, t, p) in enumerate(_CASES, 1):
        where = tr("[wrong] {name}: case {number} of {total} ({case})", name="bus_bandwidth",
                   number=number, total=len(_CASES), case=f"nbytes={n}, seconds={t:g}, "
                                                          f"world_size={p}")
        got, failed = call_learner("bus_bandwidth", learner_fn, where, n, t, p)
        if failed:
            return failed
        if not isinstance(got, numbers.Real) or isinstance(got, bool):
            return CheckResult(False, tr("{where}: expected bytes per second, got {type} "
                                         "{got!r}", where=where, type=type(got).__name__,
                                         got=got), {"world_size": p})
        if math.isclose(float(got), costmodel.bus_bandwidth(n, t, p), rel_tol=1e-6):
            continue
        why = next((text for wrong, text in _mistakes()
                    if math.isclose(float(got), wrong(n, t, p), rel_tol=1e-6)), None)
        if why is None:
            why = tr("count the bytes one rank sends in a ring all-reduce of the tensor, "
                     "divided by the time")
        return CheckResult(False, f"{where}: {why}", {"world_size": p})
    return CheckResult(True, tr("[ok] {name}: {total} cases passed", name="bus_bandwidth",
                                total=len(_CASES)))


def bus_bandwidth(nbytes, seconds, world_size):
    """The reference (``lu.show_solution("bus_bandwidth")``): a ring all-reduce sends 2 (p-1)
    chunks of n/p bytes per rank, so each link carries 2 (p-1)/p n bytes in ``seconds``."""
    return nbytes / seconds * 2 * (world_size - 1) / world_size
