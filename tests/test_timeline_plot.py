"""Timelines readable when projected: labels fit their bars, nothing overlaps, whole ranks.

Synthetic spans built in this process (a simulated 1F1B schedule), so no process is started.
"""
import random

import matplotlib

import labutils as lu

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from labutils import pipeline as pl  # noqa: E402
from labutils.core.timeline import Span  # noqa: E402
from labutils.viz.timeline_plot import plot_timeline  # noqa: E402

pytestmark = pytest.mark.lab06a1


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def one_f_one_b_spans(p, m, fwd_ms=1.0, bwd_ms=2.0, link_ms=0.1, seed=0):
    """Spans of lu.pipeline's 1F1B schedule, timed by simulation: an op starts when its stage
    is free and its input (activation from the stage before, gradient from the one after) has
    arrived. Durations jitter by 5%, like a measured run; times in seconds, from 1000 s."""
    rnd = random.Random(seed)
    ops = [list(pl.one_f_one_b_schedule(s, p, m)) for s in range(p)]
    done, free, nxt, spans = {}, [1000.0] * p, [0] * p, []
    while any(nxt[s] < len(ops[s]) for s in range(p)):
        for s in range(p):
            while nxt[s] < len(ops[s]):
                op, i = ops[s][nxt[s]]
                dep = (("F", s - 1, i) if s > 0 else None) if op == "F" else \
                    (("B", s + 1, i) if s < p - 1 else ("F", s, i))
                if dep is not None and dep not in done:
                    break
                start = max(free[s], done[dep] + link_ms / 1e3 if dep else free[s])
                ms = (fwd_ms if op == "F" else bwd_ms) * rnd.uniform(0.95, 1.05)
                free[s] = done[(op, s, i)] = start + ms / 1e3
                spans.append(Span(s, "forward" if op == "F" else "backward", start, free[s],
                                  str(i)))
                nxt[s] += 1
    return spans


def drawn_texts(fig):
    """Visible, non-empty Text artists that the last draw put on the canvas."""
    not_drawn = set()
    for ax in fig.axes:   # the axis keeps tick objects outside the view: they are not drawn
        for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            lo, hi = sorted(lim)
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if not lo <= tick.get_loc() <= hi:
                    not_drawn.update((id(tick.label1), id(tick.label2)))
    return [t for t in fig.findobj(Text)
            if t.get_visible() and t.get_text() and id(t) not in not_drawn]


def overlaps(a, b):
    """Strict: boxes that only touch do not overlap."""
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def span_labels(ax):
    return [t for t in drawn_texts(ax.figure)
            if t.axes is ax and t.get_transform() is ax.transData]


def _key(lane, label, left, width):
    return lane, label, round(left, 6), round(width, 6)


def check_readable(ax, spans, lane=lambda s: s.rank):
    """The rules of a projected timeline; returns the number of span labels drawn."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = drawn_texts(fig)
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            assert not overlaps(box_a, box_b), f"text {a!r} overlaps text {b!r}"
    t0 = min(s.start for s in spans)
    own = {_key(lane(s), s.label, (s.start - t0) * 1e3, s.duration * 1e3) for s in spans}
    labels, patches = span_labels(ax), list(ax.patches)
    for t in labels:
        x, y = t.get_position()
        # the bar seen under the label: the last drawn whose extent holds the label's centre
        under = [p for p in patches if p.get_x() <= x <= p.get_x() + p.get_width()
                 and p.get_y() <= y <= p.get_y() + p.get_height()][-1]
        lane_of = round(under.get_y() + under.get_height() / 2)
        assert _key(lane_of, t.get_text(), under.get_x(), under.get_width()) in own, \
            f"label {t.get_text()!r} is not on its own span's bar"
        bar, box = under.get_window_extent(renderer), t.get_window_extent(renderer)
        assert bar.x0 <= box.x0 and box.x1 <= bar.x1 and bar.y0 <= box.y0 and box.y1 <= bar.y1, \
            f"label {t.get_text()!r} leaves its bar"
        for p in patches[patches.index(under) + 1:]:          # bars drawn over its own
            assert not overlaps(box, p.get_window_extent(renderer)), \
                f"label {t.get_text()!r} sits on another bar"
    legend = ax.get_legend().get_window_extent(renderer)
    for p in patches:
        assert not overlaps(legend, p.get_window_extent(renderer)), "the legend covers a bar"
    assert "(ms)" in ax.get_xlabel()
    return len(labels)


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (8, 16)])  # 9-pt labels (projector sizes)
def test_pipeline_timeline_is_readable(p, m, tmp_path):
    spans = one_f_one_b_spans(p, m)
    ax = plot_timeline(spans, title=f"1f1b, p={p}, m={m}")
    shown = check_readable(ax, spans)
    assert list(ax.get_yticks()) == list(range(p))                     # whole ranks only
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank {r}" for r in range(p)]
    assert shown >= 1                                                  # thinned, not all gone
    if (p, m) == (2, 4):
        assert shown == len(spans)                                     # room for every label
    if (p, m) == (8, 16):
        assert shown < len(spans)                                      # 1 ms bars: too narrow
        path = tmp_path / "timeline.png"      # as the widget panels save it: legend kept
        ax.figure.savefig(path, dpi=100, bbox_inches="tight")
        assert path.stat().st_size > 0


def test_labels_follow_the_layout_of_notebook_subplots():
    """06a1 draws two schedules in shared-x subplots, then tight_layout: decided at draw time."""
    fig, axes = plt.subplots(2, 1, figsize=(11, 5), sharex=True)
    runs = [one_f_one_b_spans(4, m) for m in (4, 8)]
    for ax, spans in zip(axes, runs):
        got = plot_timeline(spans, ax=ax, title=f"{len(spans)} spans",
                            colors={"forward": "tab:orange"})
        assert got is ax and ax.get_title() == f"{len(spans)} spans"
    plt.tight_layout()
    wide = [check_readable(ax, spans) for ax, spans in zip(axes, runs)]
    assert axes[0].patches[0].get_facecolor() == matplotlib.colors.to_rgba("tab:orange")
    fig.set_size_inches(4, 5)                      # a narrow panel: fewer labels fit
    narrow = [check_readable(ax, spans) for ax, spans in zip(axes, runs)]
    assert all(n < w for n, w in zip(narrow, wide))


def test_rank_ticks_are_whole_ranks_even_when_crowded():
    fig, ax = plt.subplots(figsize=(8, 1.6))        # 16 ranks in a short panel
    spans = one_f_one_b_spans(16, 16)
    plot_timeline(spans, ax=ax)
    check_readable(ax, spans)
    ticks = list(ax.get_yticks())
    assert ticks and all(float(t).is_integer() and 0 <= t < 16 for t in ticks)
    assert len(ticks) < 16


def test_empty_timeline_does_not_fail():
    ax = plot_timeline([], title="nothing yet")
    ax.figure.canvas.draw()
    assert ax.get_title() == "nothing yet"


def bucket_spans(ranks=2, steps=2, buckets=6, every_ms=1.0):
    """04c-like: forward, backward, and bucket all-reduces that overlap in time."""
    spans = []
    for r in range(ranks):
        t = 0.0
        for _ in range(steps):
            spans.append(Span(r, "forward", t, t + 0.004, ""))
            spans.append(Span(r, "backward", t + 0.004, t + 0.012, ""))
            for b in range(buckets):      # launched every_ms apart, each takes 1.6 ms
                start = t + 0.005 + b * every_ms / 1e3
                spans.append(Span(r, "allreduce", start, start + 0.0016, f"b{b}"))
            t += 0.014
    return spans


@pytest.mark.parametrize("every_ms", [1.0, 0.2])
def test_bucket_overlap_plot_is_readable(every_ms):
    spans = bucket_spans(every_ms=every_ms)
    ax = lu.timeline_plot.plot_overlap(spans, title="2 ranks, BucketedDDP")
    shown = check_readable(ax, spans, lane=lambda s: 2 * s.rank + (s.name == "allreduce"))
    assert list(ax.get_yticks()) == [0, 1, 2, 3]     # compute and comm lane per rank
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "rank 0 compute", "rank 0 comm", "rank 1 compute", "rank 1 comm"]
    if every_ms == 1.0:
        assert shown == 2 * 2 * 6                      # buckets apart: every label fits
    else:
        assert 1 <= shown < 2 * 2 * 6                  # buckets 0.2 ms apart: labels thinned
