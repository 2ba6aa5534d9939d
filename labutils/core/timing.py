"""Timing that can be trusted: warm-up, repeats, medians with spread, and paired comparisons.

Used by every lab that measures (01, 03a2, 04c, 06a, ...) and by ``labutils.bench``. Measuring is
kept apart from plotting so both can be tested. On a shared 2-core machine compare *ratios*
measured side by side (``interleaved``), never a stored absolute time.

Two timings are compared as pyperf and criterion compare benchmarks, never by their extremes:

- **paired** (the rounds of one ``interleaved`` call, or per-round lists timed in lock-step):
  the per-round ratio a_i / b_i cancels the drift that hits both variants of a round alike;
  its median and a distribution-free 95% interval for that median (the order-statistic
  interval of ``scipy.stats.quantile_test``) decide, and the words follow the interval;
- **unpaired** (different runs or processes): the Mann-Whitney U rank test decides (as Google
  Benchmark's compare tool does), the ratio of medians with a bootstrap interval is shown.
"""
from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as _st

from labutils.core.i18n import tr
from labutils.core.rank import progress

CONFIDENCE = 0.95
MIN_ADAPTIVE_ROUNDS = 7


@dataclass(frozen=True)
class Stats:
    """Median, min and max of repeated measurements (seconds unless said otherwise).
    ``rounds`` names the ``interleaved`` call the values came from: two Stats with the same
    ``rounds`` are paired round by round."""
    median: float
    min: float
    max: float
    values: tuple = field(repr=False, default=())
    rounds: str = field(repr=False, compare=False, default="")

    @classmethod
    def of(cls, values, rounds=""):
        values = tuple(float(v) for v in values)
        if not values:
            raise ValueError("Stats.of needs at least one value")
        return cls(statistics.median(values), min(values), max(values), values, rounds)

    @property
    def n(self):
        return len(self.values)

    def __truediv__(self, other):
        raise TypeError("a ratio of two Stats by their extremes throws the pairing away; use "
                        "lu.timing.compare(a, b): the per-round ratio with its interval")

    def fmt(self, unit="s", scale=1.0, digits=3):
        m, lo, hi = (x * scale for x in (self.median, self.min, self.max))
        return tr("{median} {unit} (min {lo}, max {hi}, n={n})", median=f"{m:.{digits}g}",
                  unit=unit, lo=f"{lo:.{digits}g}", hi=f"{hi:.{digits}g}", n=self.n)

    def __str__(self):
        return self.fmt()


@dataclass(frozen=True)
class Comparison:
    """How a's values compare with b's: ``ratio`` (a/b), its 95% interval ``lo``-``hi``, the
    test's p-value ``p``, ``n`` (rounds, or a's and b's sizes when unpaired)."""
    ratio: float
    lo: float
    hi: float
    p: float
    paired: bool
    n: tuple

    @property
    def resolved(self):
        """The data tell the two apart: the interval excludes 1 (paired), p < 0.05 (unpaired)."""
        if self.paired:
            return self.hi < 1 or self.lo > 1
        return self.p < 1 - CONFIDENCE

    @property
    def factor(self):
        """How many times a is faster or slower than b (>= 1)."""
        return max(self.ratio, 1 / self.ratio)

    def word(self, less=None, more=None):
        """"faster than" when a is measurably smaller, "slower than" when larger, else "not
        measurably different from"; pass ``less``/``more`` for quantities other than time."""
        if self.resolved and self.ratio < 1:
            return tr("faster than") if less is None else less
        if self.resolved and self.ratio > 1:
            return tr("slower than") if more is None else more
        return tr("not measurably different from")

    def sentence(self, a, b):
        """The verdict as one whole sentence about time, ``a`` and ``b`` the two things'
        names: "On this run A was faster than B: 0.75x (95% CI ...)". Each outcome is its own
        template, so a translation can order the words as its language needs (Chinese puts
        "not measurably different" after both names: 「A 与 B 差异不显著」), which ``word``,
        one fragment between the names, cannot."""
        ratio = self.fmt()
        if self.resolved and self.ratio < 1:
            return tr("On this run {a} was faster than {b}: {ratio}", a=a, b=b, ratio=ratio)
        if self.resolved and self.ratio > 1:
            return tr("On this run {a} was slower than {b}: {ratio}", a=a, b=b, ratio=ratio)
        return tr("On this run {a} and {b} were not measurably different: {ratio}", a=a, b=b,
                  ratio=ratio)

    def equivalent(self, margin):
        """The data show a and b within ``margin`` of each other (e.g. 0.1 for 10%): the whole
        95% interval lies inside [1 - margin, 1 + margin]. Two one-sided tests at 5% each need
        only the 90% interval, so this is the stricter reading. An interval that merely
        includes 1 ("not measurably different") is not evidence of equality; this is."""
        return bool(np.isfinite(self.lo) and np.isfinite(self.hi)
                    and self.lo >= 1 - margin and self.hi <= 1 + margin)

    def word_within(self, margin, less=None, more=None):
        """For an intended null: "within ±x% of" when ``equivalent(margin)``, else ``word``."""
        if not self.resolved and self.equivalent(margin):
            return tr("within ±{pct}% of", pct=f"{100 * margin:g}")
        return self.word(less, more)

    def fmt(self, digits=3):
        g = lambda x: f"{x:.{digits}g}"
        if self.paired:
            return tr("{ratio}x (95% CI {lo}-{hi}, {n} paired rounds)", ratio=g(self.ratio),
                      lo=g(self.lo), hi=g(self.hi), n=self.n[0])
        return tr("{ratio}x (95% CI {lo}-{hi}; Mann-Whitney p={p}, {na} vs {nb} samples)",
                  ratio=g(self.ratio), lo=g(self.lo), hi=g(self.hi), p=f"{self.p:.2g}",
                  na=self.n[0], nb=self.n[1])

    def __str__(self):
        return self.fmt()


def _values(x):
    return np.asarray(x.values if isinstance(x, Stats) else x, dtype=float)


def paired_ratio(a, b):
    """Paired comparison of equal-length per-round samples: the median of a_i / b_i, its 95%
    order-statistic interval (nan bounds when too few rounds to reach 95%) and the sign test's
    p-value (that the median ratio is 1)."""
    r = _values(a) / _values(b)
    test = _st.quantile_test(r, q=1.0, p=0.5)
    ci = test.confidence_interval(confidence_level=CONFIDENCE)
    lo, hi = float(ci.low), float(ci.high)
    lo, hi = (float("nan") if not np.isfinite(lo) else lo), (float("nan") if not np.isfinite(hi) else hi)
    return Comparison(float(np.median(r)), lo, hi, float(test.pvalue), True, (len(r),))


def unpaired_ratio(a, b):
    """Unpaired comparison: ratio of medians, a bootstrap interval for it (seeded: the same data
    give the same interval) and the two-sided Mann-Whitney U p-value."""
    x, y = _values(a), _values(b)
    p = float(_st.mannwhitneyu(x, y, alternative="two-sided").pvalue)
    ratio = float(np.median(x) / np.median(y))
    if min(len(x), len(y)) < 2:
        return Comparison(ratio, float("nan"), float("nan"), p, False, (len(x), len(y)))
    boot = _st.bootstrap((x, y), lambda u, v, axis: np.median(u, axis=axis) / np.median(v, axis=axis),
                         vectorized=True, paired=False, n_resamples=2000, method="percentile",
                         confidence_level=CONFIDENCE, rng=np.random.default_rng(0))
    ci = boot.confidence_interval
    return Comparison(ratio, float(ci.low), float(ci.high), p, False, (len(x), len(y)))


def compare(a, b, paired=None):
    """Compare a with b (``Stats`` or lists of samples). ``paired``: None pairs two Stats of one
    ``interleaved`` call (the same ``rounds``) and treats anything else as unpaired; True pairs
    equal-length samples timed round by round in lock-step; False never pairs."""
    if paired is None:
        paired = (isinstance(a, Stats) and isinstance(b, Stats) and bool(a.rounds)
                  and a.rounds == b.rounds and a.n == b.n)
    if paired:
        if len(_values(a)) != len(_values(b)):
            raise ValueError(f"paired samples need one value per round on both sides; got "
                             f"{len(_values(a))} and {len(_values(b))}")
        return paired_ratio(a, b)
    return unpaired_ratio(a, b)


def versus(a, b, less=None, more=None, paired=None):
    """How ``a`` compares with ``b``, in words the data can back (``compare(a, b).word``):
    ``less`` (default "faster than") only when a is measurably smaller, ``more`` (default
    "slower than") only when larger, else "not measurably different from". The default words
    follow ``set_language``; words a notebook passes are used as given."""
    return compare(a, b, paired=paired).word(less, more)


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


def interleaved(fns, repeats=7, warmup=1, budget_s=None, max_repeats=60):
    """Time several callables round-robin (A B C A B C ...) so machine noise hits all alike.

    ``fns`` maps a label to a callable; returns a dict label -> Stats (seconds), paired: round
    i of every variant ran side by side. With ``budget_s`` the sampling adapts, as pyperf's and
    criterion's do: after ``repeats`` rounds (at least 7) rounds go on until every variant's
    interval against the first one excludes 1, or ``budget_s`` seconds of rounds have passed,
    or ``max_repeats`` rounds were run.
    """
    if repeats < 1:
        raise ValueError(f"interleaved needs repeats >= 1; got {repeats}")
    if budget_s is not None:
        repeats = max(repeats, MIN_ADAPTIVE_ROUNDS)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    names = list(fns)
    start = time.perf_counter()
    i = 0
    while True:
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        i += 1
        progress(min(i, repeats), repeats, "repeats")
        if i < repeats:
            continue
        if budget_s is None or i >= max_repeats or time.perf_counter() - start > budget_s:
            break
        if all(paired_ratio(times[n], times[names[0]]).resolved for n in names[1:]):
            break
    rounds = uuid.uuid4().hex
    return {name: Stats.of(v, rounds) for name, v in times.items()}
