"""labutils.experiments.ddp_performance, comm_spans and labutils.viz.plots: bandwidth arithmetic,
queue / peer-wait / transfer spans, exposed communication, timelines from real ranks."""
import json

import matplotlib
import pytest

import labutils as lu
from labutils import comm_spans as spans_mod
from labutils import ddp_performance as profile
from labutils import plots
from labutils.core.commcount import Call
from labutils.core.timeline import Span, to_chrome_trace
from labutils.core.timing import Stats

from .checkers import assert_check, checker_cases

matplotlib.use("Agg")


@pytest.mark.lab04c2
def test_bus_bandwidth_formula():
    assert lu.costmodel.bus_bandwidth(1e9, 1.0, 2) == pytest.approx(1e9)      # 2(p-1)/p = 1
    assert lu.costmodel.bus_bandwidth(1e9, 1.0, 4) == pytest.approx(1.5e9)    # 2 * 3 / 4
    with pytest.raises(ValueError, match="world_size >= 2"):
        lu.costmodel.bus_bandwidth(1e9, 1.0, 1)


def _call(launched, completed, nbytes=8):
    return Call("allreduce_", nbytes, 2, None, launched, completed)


@pytest.mark.lab04c1
def test_one_thread_starts_each_call_when_the_previous_one_completed():
    calls = [_call(0.0, 2.0), _call(1.0, 3.0), _call(5.0, 6.0)]
    assert spans_mod.thread_starts(calls) == [0.0, 2.0, 5.0]   # queued, queued, idle thread


@pytest.mark.lab04c1
def test_split_calls_queue_peer_wait_and_transfer():
    calls = [_call(0.0, 2.0), _call(1.0, 3.0)]
    starts = [[0.0, 2.0], [0.5, 2.25]]          # rank 1 started each bucket later
    spans = spans_mod.split_calls(0, calls, starts, step=1)
    got = [(s.name, s.label, s.start, s.end) for s in spans]
    assert got == [("queue", "b0", 0.0, 0.0), ("peer wait", "b0", 0.0, 0.5),
                   ("transfer", "b0", 0.5, 2.0),
                   ("queue", "b1", 1.0, 2.0), ("peer wait", "b1", 2.0, 2.25),
                   ("transfer", "b1", 2.25, 3.0)]
    # the three parts of a bucket add up to its launch-to-completion time
    for b, c in enumerate(calls):
        assert sum(s.duration for s in spans if s.label == f"b{b}") == pytest.approx(
            c.completed - c.launched)
    spans.append(Span(0, "backward", 0.0, 1.0, meta={"step": 1}))
    shares = spans_mod.span_shares(spans)
    assert shares["queue"] == pytest.approx(1.0 / 4.0)       # 1 s of 4 s launched-to-done
    assert shares["peer wait"] == pytest.approx(0.75 / 4.0)
    assert shares["transfer"] == pytest.approx(2.25 / 4.0)
    assert shares["transfer during backward"] == pytest.approx(0.5 / 2.25)


@pytest.mark.lab04c1
def test_bucket_profile_and_the_three_models_by_hand():
    # one rank, one step: forward 1 s, backward 2 s; buckets launched 0.5 s and 2 s into it
    spans = [Span(0, "forward", 0.0, 1.0, "1", {"step": 1}),
             Span(0, "backward", 1.0, 3.0, "1", {"step": 1}),
             Span(0, "queue", 1.5, 1.5, "b0", {"step": 1, "nbytes": 300}),
             Span(0, "transfer", 1.5, 2.0, "b0", {"step": 1, "nbytes": 300}),
             Span(0, "queue", 3.0, 3.0, "b1", {"step": 1, "nbytes": 100}),
             Span(0, "transfer", 3.0, 3.5, "b1", {"step": 1, "nbytes": 100})]
    p = spans_mod.bucket_profile(spans)
    assert p["nbytes"] == [300, 100] and p["ready"] == [0.25, 1.0]
    assert p["backward share"] == pytest.approx(2 / 3)
    assert p["transfers"] == [(300, 0.5), (100, 0.5)] and p["waits"] == []
    # alpha 0.1 s, beta 1 ms per byte, p = 2: a ring all-reduce of n bytes is 2 alpha + n beta
    pred = spans_mod.predicted_exposed(p, 3.0, 0.1, 1e-3)
    assert pred["no overlap"] == pytest.approx(0.5 + 0.3)
    # backward 2 s: bucket 0 ready at 0.5 s, done at 1.0 s; bucket 1 ready at 2 s, done 2.3 s
    assert pred["this run's buckets"] == pytest.approx(0.3)
    assert 0 <= pred["equal buckets"] <= pred["no overlap"]


@pytest.mark.lab04c1
@pytest.mark.slow
def test_bucket_profile_of_a_real_run_counts_every_gradient_byte():
    per_rank = lu.launch(spans_mod.timeline_worker, steps=2, bucket_cap_mb=0.1, world_size=2)
    p = spans_mod.bucket_profile(lu.timeline.flatten(per_rank))
    model = lu.models.DigitsCNN(channels=64, hidden=256)
    assert sum(p["nbytes"]) == 4 * sum(q.numel() for q in model.parameters())
    assert all(0.0 <= f <= 1.05 for f in p["ready"]) and p["ready"] == sorted(p["ready"])
    assert 0.0 < p["backward share"] < 1.0
    assert len(p["transfers"]) == 2 * 2 * len(p["nbytes"])     # ranks x steps x buckets
    assert len(p["waits"]) == 2 * 2 and min(p["waits"]) >= 0.0  # one per rank and step
    pred = spans_mod.predicted_exposed(p, 0.02, 1e-4, 1e-9)
    assert 0.0 <= pred["this run's buckets"] <= pred["no overlap"]


@pytest.mark.lab04c1
def test_median_interval_brackets_the_median():
    m, lo, hi = spans_mod.median_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    assert m == 5.0 and lo <= m <= hi
    lo = spans_mod.median_interval([1.0, 2.0])[1]
    assert lo != lo          # nan: 2 values are too few for a 95% interval


@pytest.mark.lab04c1
@pytest.mark.slow
def test_timeline_separates_backward_wait_and_each_buckets_parts():
    spans = [s for r in lu.launch(spans_mod.timeline_worker, steps=2, bucket_cap_mb=0.05,
                                  world_size=2) for s in r]
    for rank in (0, 1):
        for step in (1, 2):
            mine = [s for s in spans if s.rank == rank and s.meta["step"] == step]
            compute = {s.name: s for s in mine if s.name in ("forward", "backward", "wait")}
            assert set(compute) == {"forward", "backward", "wait"}
            # the wait begins where backward's computation ends
            assert compute["backward"].end == compute["wait"].start
            comm = [s for s in mine if s.name in ("peer wait", "transfer")]
            assert len(comm) >= 2 * 2                       # several buckets
            # one gloo thread: a rank's peer waits and transfers never overlap, and no span
            # is negative (no bucket completes before the last rank has started it)
            assert all(s.end >= s.start for s in mine)
            comm.sort(key=lambda s: (s.start, s.end))
            assert all(a.end <= b.start for a, b in zip(comm, comm[1:]))
            assert all(s.end <= compute["wait"].end for s in comm)
    shares = spans_mod.span_shares(spans)
    assert sum(shares[n] for n in spans_mod.COMM_SPANS) == pytest.approx(1.0)


def _after_backward_equals_bucketed(rank, world_size):
    import torch
    torch.manual_seed(rank)
    x = torch.randn(8, 16)
    out = []
    for cls in (lu.ddp.BucketedDDP, spans_mod.AfterBackwardDDP):
        torch.manual_seed(0)
        model = cls(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)),
                    bucket_cap_mb=0.001)
        model(x).square().sum().backward()
        out.append([p.grad.clone() for p in model.parameters()])
    return out


@pytest.mark.lab04c1
@pytest.mark.slow
def test_after_backward_variant_gives_the_same_gradients():
    import torch
    for bucketed, after in lu.launch(_after_backward_equals_bucketed, world_size=2):
        for g, h in zip(bucketed, after, strict=True):
            torch.testing.assert_close(h, g, rtol=0, atol=0)   # the same sums, in the same order


@pytest.mark.lab04c1
@pytest.mark.slow
def test_emulated_overlap_worker_sends_the_same_buckets_either_way():
    from labutils import emulated_overlap
    result = lu.launch(emulated_overlap.overlap_worker, rounds=2, layer_ms=0.01, batch=4, depth=4,
                       width=64, world_size=2)
    for r in result:
        assert r["grad max diff"] == 0.0        # overlapped and after backward: the same sums
        assert r["buckets"] == 1                 # 64-wide layers: the whole model in 0.5 MiB
        assert all(len(r[v]) == 2 for v in ("overlapped", "after backward", "no_sync"))
        assert r["backward sleep s"] == pytest.approx(2 * 0.01 * 4 * 4 / 1e3)
    assert result[0]["overlapped"] == result[1]["overlapped"]   # the slowest rank's, on both
    assert result[0]["rounds id"] != ""


def test_emulated_mlp_sleeps_in_every_block_and_keeps_the_values():
    import torch
    from labutils import emulated_overlap
    from labutils.parallel.emulated_stages import Delay
    m = emulated_overlap.emulated_mlp(depth=3, width=8, layer_ms=0.0)
    assert sum(isinstance(x, Delay) for x in m.modules()) == 3
    plain = lu.model_parallel.make_mlp(3, 8, 8, 8)
    x = torch.randn(2, 8)
    torch.testing.assert_close(m(x), plain(x), rtol=0, atol=0)


@pytest.mark.lab04c1
@pytest.mark.slow
def test_exposed_worker_pairs_its_rounds():
    result = lu.launch(spans_mod.exposed_worker, rounds=2, bucket_cap_mb=0.1, width=1,
                       batch_per_rank=8, world_size=2)
    for r in result:
        assert r["buckets"] > 1
        assert all(len(r[v]) == 2 for v in ("sync", "no_sync", "after backward"))
    # the slowest rank's time per round: the same lists on both ranks
    assert result[0]["sync"] == result[1]["sync"]
    (m, lo, hi), _ = spans_mod.exposed(result[0])
    assert m == m      # a number (its interval may be nan with 2 rounds)


@pytest.mark.lab04c1
def test_speedup_and_efficiency_arithmetic():
    t = {1: Stats.of([2.0, 2.2, 1.8]), 2: Stats.of([1.0, 1.0, 1.2])}
    s = plots.speedup(t)      # per paired round: 2.0, 2.2, 1.5
    assert s[1].median == pytest.approx(1.0) and s[2].median == pytest.approx(2.0)
    assert s[2].min == pytest.approx(1.5) and s[2].max == pytest.approx(2.2)
    with pytest.raises(ValueError):   # unequal rounds cannot be paired
        plots.speedup({1: Stats.of([1.0, 2.0]), 2: Stats.of([1.0])})
    assert plots.efficiency(s)[2].median == pytest.approx(1.0)


@pytest.mark.lab04c1
@pytest.mark.slow
def test_timeline_draws_two_lanes_per_rank_and_a_perfetto_trace(tmp_path):
    per_rank = lu.launch(spans_mod.timeline_worker, steps=2, bucket_cap_mb=0.1, world_size=2)
    for rank, spans in enumerate(per_rank):
        names = [s.name for s in spans]
        assert names.count("forward") == 2 and names.count("backward") == 2
        assert names.count("wait") == 2                    # the exposed part of each step
        assert names.count("transfer") == names.count("queue") == names.count("peer wait") >= 4
        for s in spans:
            assert s.rank == rank and s.end >= s.start
    spans = lu.timeline.flatten(per_rank)
    ax = lu.timeline_plot.plot_overlap(spans)
    assert len(ax.get_yticks()) == 4                      # compute and comm lane per rank
    trace = json.load(open(to_chrome_trace(spans, str(tmp_path / "t.json"))))
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == len(spans)


@pytest.mark.lab04c2
@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(lu.costmodel.bus_bandwidth, {
    # lambdas travel to the ranks by value, as a notebook's function would
    "algorithm_bandwidth": (lambda n, s, p: n / s, ("world_size=4", "algorithm bandwidth")),
    "forgot_divide_by_p": (lambda n, s, p: n / s * 2 * (p - 1), "not all of it"),
}))
def test_check_bus_bandwidth(answer, verdict):
    assert_check(lu.check_bus_bandwidth, answer, verdict)


def _count_allreduces(rank, world_size, hook):
    """(ran, collectives issued during the steps): DDP all-reduces from C++, so count the
    process group's sequence number, which every collective advances."""
    import torch.distributed.distributed_c10d as c10d
    pg = c10d._get_default_group()
    before = pg._get_sequence_number_for_group()
    stats = profile.ddp_step_worker(rank, world_size, batch_per_rank=8, steps=2, hook=hook)
    return stats.median > 0, pg._get_sequence_number_for_group() - before


@pytest.mark.slow
@pytest.mark.lab04c2
def test_ddp_step_worker_ceiling_does_not_communicate():
    ceiling = lu.launch(_count_allreduces, "none", world_size=2)
    plain = lu.launch(_count_allreduces, None, world_size=2)
    # constructing DDP broadcasts the weights (a few collectives); each DDP step adds its
    # gradient all-reduce, which no_sync leaves out
    assert all(ok for ok, _ in ceiling + plain)
    assert plain[0][1] >= ceiling[0][1] + 3
    with pytest.raises(ValueError, match="hook must be None, 'shm' or 'none'"):
        profile.ddp_step_worker(0, 1, hook="nccl")


@pytest.mark.lab04c2
@pytest.mark.slow
def test_allreduce_worker_checks_the_shared_memory_sums():
    sizes = (1 << 10, 1 << 16)
    for per_rank in lu.launch(profile.allreduce_worker, sizes=sizes, repeats=1, world_size=2):
        assert all(per_rank[n]["equal to gloo"] is True for n in sizes)
