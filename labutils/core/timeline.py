"""Per-rank timelines: record spans of work in each rank (drawn by ``labutils.viz.timeline_plot``).

Used by 04c (compute vs communication), 05 (idle ranks in naive model parallelism) and 06a1
(pipeline bubbles). ``time.perf_counter`` is a system-wide monotonic clock on Linux, macOS and
Windows, so spans recorded in different processes on one machine line up.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Span:
    rank: int
    name: str        # what kind of work: "forward", "backward", "allreduce", "idle", ...
    start: float     # seconds, perf_counter clock
    end: float
    label: str = ""  # drawn inside the bar, e.g. the micro-batch index
    meta: dict = field(default_factory=dict)

    @property
    def duration(self):
        return self.end - self.start


class Timeline:
    """Spans of one rank. ``with tl.span("forward", label="0"): ...``; return ``tl.spans``."""

    def __init__(self, rank):
        self.rank = rank
        self.spans = []

    @contextmanager
    def span(self, name, label="", **meta):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.spans.append(Span(self.rank, name, start, time.perf_counter(), str(label), meta))

    def add(self, name, start, end, label="", **meta):
        self.spans.append(Span(self.rank, name, start, end, str(label), meta))


def flatten(per_rank):
    """A list of span lists (one per rank, as ``lu.launch`` returns them) -> one list."""
    return [s for spans in per_rank for s in spans]


def normalise(spans):
    """Shift times so the earliest span starts at 0."""
    if not spans:
        return []
    t0 = min(s.start for s in spans)
    return [Span(s.rank, s.name, s.start - t0, s.end - t0, s.label, s.meta) for s in spans]


def busy_fraction(spans, names=None):
    """Share of ranks x makespan covered by spans (of the given names): 1 - idle share."""
    spans = normalise(spans)
    if not spans:
        raise ValueError("no spans recorded")
    ranks = {s.rank for s in spans}
    makespan = max(s.end for s in spans) - min(s.start for s in spans)
    busy = sum(s.duration for s in spans if names is None or s.name in names)
    return busy / (len(ranks) * makespan)


def bubble_fraction(spans, names=None):
    """Measured idle share of the timeline: compare with (p-1)/(m+p-1) for a pipeline."""
    return 1.0 - busy_fraction(spans, names)


# ---- export --------------------------------------------------------------------------------


def to_chrome_trace(spans, path):
    """Write spans as a Chrome/Perfetto trace (open it at ui.perfetto.dev)."""
    spans = normalise(spans)
    events = [{"name": s.label or s.name, "cat": s.name, "ph": "X", "pid": 0, "tid": s.rank,
               "ts": s.start * 1e6, "dur": s.duration * 1e6, "args": s.meta} for s in spans]
    events += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": r,
                "args": {"name": f"rank {r}"}} for r in sorted({s.rank for s in spans})]
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return path
