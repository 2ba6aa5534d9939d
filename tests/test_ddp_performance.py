"""labutils.experiments.ddp_performance and labutils.viz.plots: bandwidth arithmetic, overlap, timelines from real ranks."""
import json

import matplotlib
import pytest

import labutils as lu
from labutils import ddp_performance as profile
from labutils import plots
from labutils.core.timeline import Span, to_chrome_trace
from labutils.core.timing import Stats

from .checkers import assert_check, checker_cases

matplotlib.use("Agg")


@pytest.mark.lab04c
def test_bus_bandwidth_formula():
    assert lu.costmodel.bus_bandwidth(1e9, 1.0, 2) == pytest.approx(1e9)      # 2(p-1)/p = 1
    assert lu.costmodel.bus_bandwidth(1e9, 1.0, 4) == pytest.approx(1.5e9)    # 2 * 3 / 4
    with pytest.raises(ValueError, match="world_size >= 2"):
        lu.costmodel.bus_bandwidth(1e9, 1.0, 1)


@pytest.mark.lab04c
def test_overlap_counts_only_the_same_rank_and_step():
    def span(rank, name, start, end, step):
        return Span(rank, name, start, end, meta={"step": step})
    spans = [span(0, "backward", 0.0, 1.0, 1), span(0, "allreduce", 0.5, 1.5, 1),
             span(0, "wait", 1.0, 1.6, 1),
             span(1, "backward", 2.0, 3.0, 1), span(1, "allreduce", 0.0, 1.0, 1),
             span(1, "wait", 3.0, 3.0, 1),
             span(0, "backward", 5.0, 6.0, 2), span(0, "allreduce", 5.0, 5.5, 2)]
    per = profile.overlap_by_step(spans)
    assert per[(0, 1)] == pytest.approx((0.5, 0.6))   # half of its all-reduce under backward
    assert per[(1, 1)] == pytest.approx((0.0, 0.0))   # rank 0's backward does not count
    assert per[(0, 2)] == pytest.approx((1.0, 0.0))   # step 1's spans do not count for step 2


@pytest.mark.lab04c
@pytest.mark.slow
def test_timeline_separates_backward_from_the_wait_for_buckets():
    spans = [s for r in lu.launch(profile.timeline_worker, steps=2, bucket_cap_mb=0.05,
                                  world_size=2) for s in r]
    for rank in (0, 1):
        for step in (1, 2):
            mine = {s.name: s for s in spans if s.rank == rank and s.meta["step"] == step
                    and s.name != "allreduce"}
            assert set(mine) == {"forward", "backward", "wait"}
            # the wait begins where backward's computation ends, and every bucket's
            # all-reduce ends before the wait does
            assert mine["backward"].end == mine["wait"].start
            assert all(s.end <= mine["wait"].end for s in spans
                       if s.rank == rank and s.meta["step"] == step and s.name == "allreduce")
    per = profile.overlap_by_step(spans)
    assert len(per) == 4 and all(0.0 <= h <= 1.0 and e >= 0.0 for h, e in per.values())


@pytest.mark.lab04c
def test_speedup_and_efficiency_arithmetic():
    t = {1: Stats.of([2.0, 2.2, 1.8]), 2: Stats.of([1.0, 1.1, 0.9])}
    s = plots.speedup(t)
    assert s[1].median == pytest.approx(1.0) and s[2].median == pytest.approx(2.0)
    assert s[2].min == pytest.approx(1.8 / 1.1) and s[2].max == pytest.approx(2.2 / 0.9)
    assert plots.efficiency(s)[2].median == pytest.approx(1.0)


@pytest.mark.lab04c
@pytest.mark.slow
def test_timeline_shows_bucket_allreduces_and_a_perfetto_trace(tmp_path):
    per_rank = lu.launch(profile.timeline_worker, steps=2, bucket_cap_mb=0.1, world_size=2)
    for rank, spans in enumerate(per_rank):
        names = [s.name for s in spans]
        assert names.count("forward") == 2 and names.count("backward") == 2
        assert names.count("allreduce") >= 2 * 2          # several buckets per step
        for s in spans:
            assert s.rank == rank and s.end >= s.start
        assert names.count("wait") == 2                    # the exposed part of each step
        wait_end = max(s.end for s in spans if s.name == "wait")
        assert max(s.end for s in spans if s.name == "allreduce") <= wait_end
    spans = lu.timeline.flatten(per_rank)
    ax = lu.timeline_plot.plot_overlap(spans)
    assert len(ax.get_yticks()) == 4                      # compute and comm lane per rank
    trace = json.load(open(to_chrome_trace(spans, str(tmp_path / "t.json"))))
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == len(spans)


@pytest.mark.lab04c
@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(lu.costmodel.bus_bandwidth, {
    # lambdas travel to the ranks by value, as a notebook's function would
    "algorithm_bandwidth": (lambda n, s, p: n / s, ("world_size=3", "expected")),
    "forgot_divide_by_p": (lambda n, s, p: n / s * 2 * (p - 1), "expected"),
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
@pytest.mark.lab04c
def test_ddp_step_worker_ceiling_does_not_communicate():
    ceiling = lu.launch(_count_allreduces, "none", world_size=2)
    plain = lu.launch(_count_allreduces, None, world_size=2)
    # constructing DDP broadcasts the weights (a few collectives); each DDP step adds its
    # gradient all-reduce, which no_sync leaves out
    assert all(ok for ok, _ in ceiling + plain)
    assert plain[0][1] >= ceiling[0][1] + 3
    with pytest.raises(ValueError, match="hook must be None, 'shm' or 'none'"):
        profile.ddp_step_worker(0, 1, hook="nccl")


@pytest.mark.lab04c
@pytest.mark.slow
def test_allreduce_worker_checks_the_shared_memory_sums():
    sizes = (1 << 10, 1 << 16)
    for per_rank in lu.launch(profile.allreduce_worker, sizes=sizes, repeats=1, world_size=2):
        assert all(per_rank[n]["equal to gloo"] is True for n in sizes)
