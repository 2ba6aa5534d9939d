"""lu.timing: warm-up calls are not measured, repeats are, interleaving alternates the variants,
and slowest takes the per-sample maximum over ranks. Fake callables and a fake clock: no
process is started and nothing depends on how fast this machine is."""
import types

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


def test_stats_ratio_is_ratio_of_medians_with_extreme_bounds():
    a, b = lu.timing.Stats.of([4.0, 6.0, 8.0]), lu.timing.Stats.of([1.0, 2.0, 4.0])
    r = a / b
    assert (r.median, r.min, r.max) == (3.0, 1.0, 8.0)  # 6/2, 4/4, 8/1


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
    assert (result["slow"] / result["fast"]).median == 3.0


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


def test_versus_names_a_difference_only_when_the_ranges_do_not_overlap():
    fast, slow = lu.timing.Stats.of([1.0, 1.1, 1.2]), lu.timing.Stats.of([1.3, 1.4, 2.0])
    touching = lu.timing.Stats.of([1.2, 1.25, 1.5])
    assert lu.timing.versus(fast, slow) == "faster than"
    assert lu.timing.versus(slow, fast) == "slower than"
    assert lu.timing.versus(fast, touching) == "not measurably different from"   # 1.2 == 1.2
    assert lu.timing.versus(slow, fast, "below", "above") == "above"
