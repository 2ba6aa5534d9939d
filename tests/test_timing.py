"""lu.timing: warm-up calls are not measured, repeats are, interleaving alternates the variants,
and slowest takes the per-sample maximum over ranks. Fake callables and a fake clock: no
process is started and nothing depends on how fast this machine is."""
import types

import numpy as np

import pytest

import labutils as lu


class FakeClock:
    """Stands in for ``time`` inside lu.timing: ``perf_counter`` reads a counter that only the
    fake callables advance, so every measured duration is known exactly."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    """Replace the ``time`` that measure() and interleaved() read, in the module that defines
    them (whatever that module is called: found through the functions' own globals)."""
    fake = FakeClock()
    for fn in (lu.timing.measure, lu.timing.interleaved):
        monkeypatch.setitem(fn.__globals__, "time", types.SimpleNamespace(
            perf_counter=fake.perf_counter))
    return fake


# ---- Stats ----------------------------------------------------------------------------------

def test_stats_of_median_min_max_and_n():
    s = lu.timing.Stats.of([3, 1, 2, 10])
    assert (s.median, s.min, s.max, s.n) == (2.5, 1.0, 10.0, 4)
    assert s.values == (3.0, 1.0, 2.0, 10.0)  # kept in measurement order
    assert "n=4" in str(s)


def test_stats_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="at least one value"):
        lu.timing.Stats.of([])


def test_dividing_two_stats_is_refused_with_the_fix():
    a, b = lu.timing.Stats.of([4.0, 6.0, 8.0]), lu.timing.Stats.of([1.0, 2.0, 4.0])
    with pytest.raises(TypeError, match="lu.timing.compare"):
        a / b


# ---- measure --------------------------------------------------------------------------------

@pytest.mark.parametrize("repeats,warmup", [(1, 0), (5, 1), (3, 4)])
def test_measure_calls_warmup_plus_repeats_and_records_repeats(repeats, warmup):
    calls = []
    stats = lu.timing.measure(lambda: calls.append(1), repeats=repeats, warmup=warmup)
    assert len(calls) == warmup + repeats
    assert stats.n == repeats and len(stats.values) == repeats


def test_measure_records_exactly_the_measured_calls(clock):
    # warm-up calls take 100 s each, measured call k takes k s: a recorded warm-up, or a
    # duration attributed to the wrong call, would show in the values
    calls = []

    def fn():
        calls.append(clock.now)
        clock.advance(100.0 if len(calls) <= 2 else float(len(calls) - 2))

    stats = lu.timing.measure(fn, repeats=5, warmup=2)
    assert len(calls) == 7
    assert stats.values == (1.0, 2.0, 3.0, 4.0, 5.0)
    assert (stats.median, stats.min, stats.max) == (3.0, 1.0, 5.0)


def test_measure_defaults(clock):
    calls = []

    def fn():
        calls.append(1)
        clock.advance(0.5)

    stats = lu.timing.measure(fn)
    assert len(calls) == 8           # 1 warm-up + 7 repeats, the documented defaults
    assert stats.values == (0.5,) * 7


def test_measure_without_repeats_is_an_error():
    calls = []
    with pytest.raises(ValueError):
        lu.timing.measure(lambda: calls.append(1), repeats=0, warmup=0)
    assert calls == []


def test_measure_propagates_the_callables_error():
    def boom():
        raise KeyError("inside fn")
    with pytest.raises(KeyError, match="inside fn"):
        lu.timing.measure(boom, repeats=3, warmup=0)


# ---- interleaved ----------------------------------------------------------------------------

def _recorders(order, clock=None, durations=None):
    def make(name):
        def fn():
            order.append(name)
            if clock is not None:
                clock.advance(durations[name])
        return fn
    return {name: make(name) for name in (durations or {"a": 0, "b": 0, "c": 0})}


def test_interleaved_alternates_round_robin_warmup_included():
    order = []
    fns = _recorders(order)
    result = lu.timing.interleaved(fns, repeats=3, warmup=2)
    assert order == ["a", "b", "c"] * (2 + 3)   # A B C A B C ..., never A A A B B B
    assert list(result) == ["a", "b", "c"]
    assert all(result[k].n == 3 for k in result)


def test_interleaved_attributes_each_duration_to_its_own_label(clock):
    durations = {"slow": 3.0, "fast": 1.0}
    order = []
    result = lu.timing.interleaved(_recorders(order, clock, durations), repeats=4, warmup=1)
    assert order == ["slow", "fast"] * 5
    assert result["slow"].values == (3.0,) * 4
    assert result["fast"].values == (1.0,) * 4
    c = lu.timing.compare(result["slow"], result["fast"])
    assert c.paired and c.ratio == 3.0
    assert not c.resolved        # 4 rounds are too few for a 95% interval of the median


def test_interleaved_warmup_not_recorded(clock):
    calls = {"x": 0, "y": 0}

    def make(name):
        def fn():
            calls[name] += 1
            clock.advance(50.0 if calls[name] == 1 else 2.0)  # the first call is the warm-up
        return fn

    result = lu.timing.interleaved({n: make(n) for n in calls}, repeats=3, warmup=1)
    assert calls == {"x": 4, "y": 4}
    assert result["x"].values == result["y"].values == (2.0, 2.0, 2.0)


def test_interleaved_without_repeats_is_an_error():
    with pytest.raises(ValueError):
        lu.timing.interleaved({"a": lambda: None}, repeats=0)


# ---- slowest --------------------------------------------------------------------------------

def test_slowest_takes_per_sample_max_across_ranks():
    per_rank = [[1.0, 5.0, 2.0, 0.5],     # rank 0 slowest in sample 1
                [3.0, 1.0, 2.5, 0.25],    # rank 1 slowest in samples 0 and 2
                [2.0, 4.0, 1.0, 0.75]]    # rank 2 slowest in sample 3
    assert lu.timing.slowest(per_rank) == [3.0, 5.0, 2.5, 0.75]


def test_slowest_is_not_the_max_of_per_rank_medians():
    # per-rank medians are both 1.0; the per-step maximum is 2.0 every step
    per_rank = [[2.0, 1.0, 2.0, 1.0, 1.0], [1.0, 2.0, 1.0, 2.0, 2.0]]
    step = lu.timing.slowest(per_rank)
    assert step == [2.0] * 5
    assert lu.timing.Stats.of(step).median == 2.0


def test_slowest_single_rank_is_identity():
    assert lu.timing.slowest([[0.1, 0.3, 0.2]]) == [0.1, 0.3, 0.2]


# ---- paired and unpaired comparisons --------------------------------------------------------

def _drifting_pair(n, ratio, seed=0, jitter=0.002):
    """b drifts by 1-10x from round to round (a loaded machine); a is ``ratio`` times b in every
    round, give or take ``jitter``."""
    rng = np.random.default_rng(seed)
    b = rng.uniform(1.0, 10.0, n)
    return ratio * b * (1 + rng.uniform(-jitter, jitter, n)), b


@pytest.mark.parametrize("seed", range(5))
def test_a_constant_ratio_under_drift_resolves_where_min_max_ranges_cannot(seed):
    a, b = _drifting_pair(7, 0.8, seed)
    sa, sb = lu.timing.Stats.of(a, "r1"), lu.timing.Stats.of(b, "r1")
    assert sa.min < sb.max and sb.min < sa.max          # the ranges overlap: min-max says "same"
    c = lu.timing.compare(sa, sb)
    assert c.paired and c.resolved
    assert 0.79 <= c.lo <= c.ratio <= c.hi <= 0.81
    assert lu.timing.versus(sa, sb) == "faster than" and lu.timing.versus(sb, sa) == "slower than"
    assert "7 paired rounds" in str(c)


def test_interleaved_series_are_paired_and_adaptive_rounds_stop_once_resolved(clock):
    # a is 0.8x b in every round while the machine's speed drifts 1-10x between rounds
    a, b = _drifting_pair(60, 0.8, seed=3)
    k = {"a": 0, "b": 0}

    def make(name, series):
        def fn():
            clock.advance(series[k[name]])
            k[name] += 1
        return fn

    out = lu.timing.interleaved({"b": make("b", b), "a": make("a", a)}, repeats=3, warmup=0,
                                budget_s=1e9)
    assert out["a"].n == out["b"].n == 7               # at least 7 rounds, resolved at once
    c = lu.timing.compare(out["a"], out["b"])
    assert c.paired and c.word() == "faster than" and 0.79 <= c.lo <= c.hi <= 0.81


def test_adaptive_rounds_go_on_until_the_budget_when_nothing_resolves(clock):
    # identical variants never resolve: the rounds stop at the time budget, not before
    def fn():
        clock.advance(1.0)
    out = lu.timing.interleaved({"x": fn, "y": fn}, repeats=7, warmup=0, budget_s=30.0)
    assert out["x"].n == 16                            # 2 s a round: past 30 s after round 16
    assert not lu.timing.compare(out["x"], out["y"]).resolved
    capped = lu.timing.interleaved({"x": fn, "y": fn}, warmup=0, budget_s=1e9, max_repeats=9)
    assert capped["x"].n == 9


def test_stats_of_different_calls_are_not_paired():
    a, b = _drifting_pair(7, 0.8, seed=1)
    c = lu.timing.compare(lu.timing.Stats.of(a, "r1"), lu.timing.Stats.of(b, "r2"))
    assert not c.paired and not c.resolved             # a rank test sees overlapping samples
    assert "Mann-Whitney" in str(c)
    with pytest.raises(ValueError, match="one value per round"):
        lu.timing.compare([1.0, 2.0], [1.0], paired=True)


def test_unpaired_samples_are_decided_by_the_rank_test():
    fast = [1.0, 1.1, 1.05, 0.98, 1.02, 1.07, 1.01]
    slow = [1.3, 1.4, 2.0, 1.35, 1.5, 1.32, 1.6]
    c = lu.timing.compare(fast, slow)
    assert not c.paired and c.p < 0.01 and c.resolved and c.hi < 1
    assert lu.timing.versus(fast, slow) == "faster than"
    assert lu.timing.versus(slow, fast, "below", "above") == "above"
    # one outlier in a sample of 7 does not hide a clear difference, as min-max ranges would
    assert lu.timing.versus(fast[:-1] + [9.0], slow) == "faster than"
    same = lu.timing.compare(fast, list(reversed(fast)))
    assert not same.resolved and same.word() == "not measurably different from"


def test_too_few_paired_rounds_never_claim_a_difference():
    c = lu.timing.compare([1.0, 1.0, 1.0, 1.0, 1.0], [2.0] * 5, paired=True)
    assert not c.resolved        # 5 rounds cannot give a 95% interval for the median ratio
    assert c.word() == "not measurably different from"


def test_an_intended_null_is_within_its_margin_only_when_the_whole_interval_is():
    rng = np.random.default_rng(0)
    base = rng.uniform(1.0, 2.0, 40)
    close = base * rng.uniform(0.97, 1.03, 40)           # within 3% round by round
    c = lu.timing.compare(close, base, paired=True)
    assert c.equivalent(0.05) and c.word_within(0.05) == "within ±5% of"
    assert not c.equivalent(0.001)                       # a margin too tight for the data
    assert c.word_within(0.001) == "not measurably different from"
    noisy = base * rng.uniform(0.5, 1.5, 40)             # untold apart, but not shown equal
    n = lu.timing.compare(noisy, base, paired=True)
    assert not n.resolved and not n.equivalent(0.05)
    assert n.word_within(0.05) == "not measurably different from"
    slower = lu.timing.compare(base * 1.2, base, paired=True)
    assert slower.word_within(0.5) == "slower than"      # a real difference is never "within"
    few = lu.timing.compare([1.0] * 5, [1.0] * 5, paired=True)
    assert not few.equivalent(0.5)                       # no 95% interval from 5 rounds
