"""The idle share of a micro-batched forward pass, measured (05).

One launch runs every variant (micro-batch count m, ``send`` or ``isend``) round-robin for
``repeats`` rounds, so machine noise hits all alike, then times a ping-pong of one micro-batch's
activation. Each run's idle share is set beside (p-1)/(m+p-1), which assumes a slot of work
per micro-batch and nothing between slots; the measured gap between a rank's consecutive
micro-batches (receiving, handing on, waking up) is what it leaves out.
"""
from __future__ import annotations

import itertools
import statistics
import time

import torch
import torch.distributed as dist

from labutils.core.launcher import launch
from labutils.core.rank import progress
from labutils.core.timeline import Timeline, bubble_fraction, flatten
from labutils.core.timing import Stats
from labutils.cost.step_time import bubble_fraction as predicted_bubble  # (p-1)/(m+p-1)
from labutils.experiments.stage_observers import stage_spans
from labutils.parallel.microbatch import microbatched_forward, validate_microbatches
from labutils.parallel.model_parallel import boundary_shapes, split_model


def _ping_pong(rank, shape, rounds):
    """Seconds of one hop (half a round trip) of a tensor of ``shape``, ranks 0 and 1."""
    t, hops = torch.zeros(shape), []
    dist.barrier()
    for _ in range(rounds if rank < 2 else 0):
        start = time.perf_counter()
        if rank == 0:
            dist.send(t, dst=1)
            dist.recv(t, src=1)
        else:
            dist.recv(t, src=0)
            dist.send(t, dst=0)
        hops.append((time.perf_counter() - start) / 2)
    dist.barrier()
    return hops


def timed_forward(rank, world_size, stages, x, n_microbatches, blocking=False):
    """``microbatched_forward`` of ``x`` cut into ``n_microbatches``, with a "forward" span per
    micro-batch on this rank's stage (labelled by index); the ranks start together. Returns
    (output or None, spans)."""
    validate_microbatches(x.shape[0], n_microbatches)
    x_mbs = x.chunk(n_microbatches)
    in_shape = boundary_shapes(stages, x_mbs[0])[rank]     # before the clocks start
    tl = Timeline(rank)
    dist.barrier()                                  # start the clocks together
    with stage_spans(stages[rank], tl, labels=range(n_microbatches)):
        out = microbatched_forward(rank, world_size, stages[rank], x_mbs, in_shape, blocking)
    return out, tl.spans


def _worker(rank, world_size, model_fn, x, variants, repeats, rounds):
    stages = split_model(model_fn(), world_size)
    spans = {v: [] for v in variants}
    outputs = {}
    for i in range(repeats):
        for m, blocking in variants:
            outputs[(m, blocking)], s = timed_forward(rank, world_size, stages, x, m, blocking)
            spans[(m, blocking)].append(s)
        progress(i + 1, repeats, "repeats")
    if not rounds or world_size < 2:                # no hop to time
        return {"spans": spans, "outputs": outputs, "hops": []}
    with torch.no_grad():
        shape = stages[0](x.chunk(max(m for m, _ in variants))[0]).shape
    return {"spans": spans, "outputs": outputs, "hops": _ping_pong(rank, shape, rounds)}


def _gaps(spans, rank):
    """Seconds between one rank's consecutive micro-batches."""
    mine = sorted((s for s in spans if s.rank == rank), key=lambda s: s.start)
    return [b.start - a.end for a, b in itertools.pairwise(mine)]


def summarise(spans, world_size, m):
    """One run: idle share, makespan, median compute t of a micro-batch on a stage, median gap
    g on the last rank, and (p-1)/(m+p-1) with each slot lasting t + g instead of t."""
    p = world_size
    makespan = max(s.end for s in spans) - min(s.start for s in spans)
    t = statistics.median(s.duration for s in spans)
    gap = statistics.median(_gaps(spans, p - 1)) if m > 1 else 0.0
    return {"idle": bubble_fraction(spans), "makespan": makespan, "t": t, "gap": gap,
            "with_gaps": 1 - m * t / ((m + p - 1) * (t + gap))}


def measure(model_fn, x, world_size=4, variants=((1, False), (8, True), (8, False)),
            repeats=5, rounds=30):
    """{(m, blocking): row} with Stats (over ``repeats``) of every ``summarise`` figure, the
    formula, the last rank's output of each variant and the spans of the last repeat; and
    ``"hop"``: Stats of one message hop (s), None with ``rounds=0`` or one rank."""
    for m, _ in variants:
        validate_microbatches(x.shape[0], m)
    split_model(model_fn(), world_size)                 # bad splits raise here, not in ranks
    results = launch(_worker, model_fn, x, list(variants), repeats, rounds,
                     world_size=world_size, timeout=120.0)
    rows = {}
    for v in variants:
        runs = [flatten([r["spans"][v][i] for r in results]) for i in range(repeats)]
        per_run = [summarise(s, world_size, v[0]) for s in runs]
        rows[v] = {k: Stats.of([run[k] for run in per_run]) for k in per_run[0]}
        rows[v].update(formula=predicted_bubble(world_size, v[0]), spans=runs[-1],
                       output=results[-1]["outputs"][v])
    rows["hop"] = Stats.of(results[0]["hops"]) if results[0]["hops"] else None
    return rows


def _send_wait(rank, world_size, delay, blocking):
    t = torch.zeros(8, 32)
    dist.barrier()
    if rank == 1:
        time.sleep(delay)                          # the receiver is busy, then posts its recv
        dist.recv(t, src=0)
        return None
    start = time.perf_counter()
    work = None if blocking else dist.isend(t, dst=1)
    if blocking:
        dist.send(t, dst=1)
    returned = time.perf_counter() - start
    if work is not None:
        work.wait()
    return returned


def send_returns_after(delay=0.2):
    """Seconds until ``dist.send`` and ``dist.isend`` return on rank 0 when rank 1 posts its
    ``recv`` ``delay`` seconds late: {"send": s, "isend": s}."""
    return {name: launch(_send_wait, delay, name == "send", world_size=2)[0]
            for name in ("send", "isend")}
