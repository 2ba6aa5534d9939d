"""Timing that can be trusted: warm-up, repeats, medians with spread, interleaved comparisons.

Used by every lab that measures (01, 03a, 04c, 06a, ...) and by ``labutils.bench``. Measuring is
kept apart from plotting so both can be tested. On a shared 2-core machine compare *ratios*
measured side by side (``interleaved``), never a stored absolute time.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from labutils.core.i18n import tr
from labutils.core.rank import progress


@dataclass(frozen=True)
class Stats:
    """Median, min and max of repeated measurements (seconds unless said otherwise)."""
    median: float
    min: float
    max: float
    values: tuple = field(repr=False, default=())

    @classmethod
    def of(cls, values):
        values = tuple(float(v) for v in values)
        if not values:
            raise ValueError("Stats.of needs at least one value")
        return cls(statistics.median(values), min(values), max(values), values)

    @property
    def n(self):
        return len(self.values)

    def __truediv__(self, other):
        """Ratio of medians, the spread bounded by the extreme pairs."""
        return Stats(self.median / other.median, self.min / other.max, self.max / other.min)

    def fmt(self, unit="s", scale=1.0, digits=3):
        m, lo, hi = (x * scale for x in (self.median, self.min, self.max))
        return tr("{median} {unit} (min {lo}, max {hi}, n={n})", median=f"{m:.{digits}g}",
                  unit=unit, lo=f"{lo:.{digits}g}", hi=f"{hi:.{digits}g}", n=self.n)

    def __str__(self):
        return self.fmt()


def versus(a, b, less=None, more=None):
    """How ``a`` compares with ``b``, in words the data can back: ``less`` (default "faster
    than") only when a's whole range (min-max) lies below b's, ``more`` (default "slower than")
    only when it lies above; overlapping ranges are "not measurably different from". The
    default words follow ``set_language``; words a notebook passes are used as given."""
    if a.max < b.min:
        return tr("faster than") if less is None else less
    if a.min > b.max:
        return tr("slower than") if more is None else more
    return tr("not measurably different from")


def slowest(per_rank):
    """In the caller: per sample, the max over ranks of ``per_rank`` (one list of seconds per
    rank): a collective, or a step of a data-parallel job, ends when its slowest rank does."""
    if len({len(ts) for ts in per_rank}) > 1:
        raise ValueError(f"every rank must time the same samples; got {[len(t) for t in per_rank]}")
    return [max(ts) for ts in zip(*per_rank)]


def slowest_rank(times, group=None):
    """Inside a rank, on every rank: the same reduction as ``slowest``, by one all-reduce (MAX)
    of this rank's ``times`` (a list, or a list of equal-length lists); returns the result."""
    import torch
    import torch.distributed as dist
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def measure(fn, repeats=7, warmup=1):
    """Call ``fn()`` ``warmup`` times unmeasured, then ``repeats`` times; Stats in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        progress(i + 1, repeats, "repeats")   # after the clock stops: a panel's bar moves
    return Stats.of(times)


def interleaved(fns, repeats=7, warmup=1):
    """Time several callables round-robin (A B C A B C ...) so machine noise hits all alike.

    ``fns`` maps a label to a callable; returns a dict label -> Stats (seconds).
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for i in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        progress(i + 1, repeats, "repeats")
    return {name: Stats.of(v) for name, v in times.items()}
