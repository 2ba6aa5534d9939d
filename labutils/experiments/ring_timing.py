"""Ring attention measured (06d2): the work each rank does under a contiguous and a zig-zag split
(query-key pairs and chunk pairs counted from the masks the ring used), each rank's attention
time for both splits (interleaved repeats), a per-rank timeline of "compute block" and
"wait for K/V" spans, each transfer's flight (post to arrival; in the serial variant all of it
exposed) and the rank's waits for it, and the forward's step time with the hops overlapped against the serial variant (zig-zag), on
this machine's loopback and on an EMULATED link (``emulation.emulate``: each hop then takes the
link's modelled time; the compute is real). All of it observed from outside the ring by
``ring_trace.trace_ring``. Timed only where every rank has a core (``run`` refuses more ranks
than cores); ``count_work`` counts the work at any N, untimed.

* ``balance_worker``: all of it, on every rank; ``run``: it on ``world_size`` ranks;
  ``count_work``: the counts alone (a correctness check, nothing timed);
* ``pairs_formula`` and ``blocks_formula``: what the counts must be;
* ``overlap_share``: a transfer's flight covered by compute, from one forward's records (near 1
  by construction when the hop is posted before computing: it shows the schedule, not hiding;
  hiding shows as the paired serial - overlapped step time);
* ``slowest_words``: which rank was slowest, in words the paired rounds back;
  ``slowest_per_round``: the slowest rank's time in each round (the ring's next layer waits
  for it).
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

from labutils.core.env import cpu_count
from labutils.core.i18n import N_, tr
from labutils.core.launcher import launch
from labutils.core.rank import progress
from labutils.core.timeline import Span
from labutils.core.timing import Stats, compare, slowest
from labutils.experiments.ring_trace import trace_ring
from labutils.parallel.emulation import emulate
from labutils.parallel.ring_attention import LAYOUTS, RingLayout, qkv, ring_attention_forward


def pairs_formula(seq, world_size, kind, rank):
    """Visible query-key pairs of rank ``rank``: contiguous blocks of b = s/N, rank r sees r full
    blocks and the lower triangle of its own, r b^2 + b(b+1)/2; zig-zag chunks of c = s/(2N),
    the sum over its positions p of p + 1, (2N-1) c^2 + c(c+1) on every rank."""
    if kind == "contiguous":
        b = seq // world_size
        return rank * b * b + b * (b + 1) // 2
    c = seq // (2 * world_size)
    return (2 * world_size - 1) * c * c + c * (c + 1)


def blocks_formula(world_size, kind, rank):
    """Chunk pairs computed (not wholly in the future): contiguous r + 1 blocks of s/N; zig-zag
    3 chunk pairs of s/(2N) on its own block and 2 on each of the N-1 others, 2N + 1."""
    return rank + 1 if kind == "contiguous" else 2 * world_size + 1


def overlap_share(spans, flights):
    """(seconds of transfer flight during which the rank computed, seconds in flight) for one
    forward: a flight runs from posting the isend/irecv to the end of waiting for it. The end
    is when the rank learns the block arrived, so a flight is an upper bound of the transfer."""
    compute = [(s.start, s.end) for s in spans if s.name == "compute block"]
    covered = sum(max(0.0, min(b, e) - max(a, p)) for p, e in flights for a, b in compute)
    return covered, sum(e - p for p, e in flights)


# the link the emulated variants put under each hop: a hop of this lab's K/V block then takes a
# few milliseconds, about one block's compute here, so hiding it or not shows in the step time
EMULATED_LINK = "1GbE"

# the timed variants, interleaved: (split, hops posted before computing, emulated link or None)
VARIANTS = {"contiguous": ("contiguous", True, None), "zigzag": ("zigzag", True, None),
            "serial": ("zigzag", False, None),
            "zigzag, emulated link": ("zigzag", True, EMULATED_LINK),
            "serial, emulated link": ("zigzag", False, EMULATED_LINK)}


def _spans(trace, rank):
    """The trace's computes and K/V waits as timeline spans."""
    names = {"compute": N_("compute block"), "wait K/V": N_("wait for K/V")}
    return [Span(rank, names[e.what], e.start, e.end, e.label) for e in trace.events
            if e.what in names]


def _forward(q, k, v, layout, rank, overlap, link=None):
    dist.barrier()                        # start together: waits then measure the ring alone
    with trace_ring(layout) as trace, (emulate(link) if link else contextlib.nullcontext()):
        t0 = time.perf_counter()
        ring_attention_forward(layout.shard(q, rank), layout.shard(k, rank),
                               layout.shard(v, rank), layout, rank, overlap)
        step = time.perf_counter() - t0
    compute = sum(e.end - e.start for e in trace.spans("compute"))
    return trace, compute, step


def balance_worker(rank, world_size, seq=2048, heads=4, head_dim=16, repeats=7, seed=0,
                   variants=None):
    """Every variant's ring forward (``VARIANTS``), interleaved for ``repeats`` rounds after one
    warm-up (float32, no grad). Returns per variant: ``counts`` (pairs and chunk pairs, every
    round alike), ``compute`` (this rank's seconds computing, per round), ``step`` (this
    rank's forward, barrier to done, per round), ``overlap`` ((covered, in flight) per round),
    ``wait`` (seconds spent waiting for K/V hops, per round) and ``spans`` (the last round's)."""
    q, k, v, _ = qkv(seq, heads, head_dim, seed=seed, dtype=torch.float32)
    layouts = {kind: RingLayout(seq, world_size, kind) for kind in LAYOUTS}
    variants = {name: VARIANTS[name] for name in (variants or VARIANTS)}
    out = {name: {"compute": [], "step": [], "overlap": [], "wait": [], "counts": None}
           for name in variants}
    with torch.no_grad():
        for name, (kind, overlap, link) in variants.items():               # warm-up
            out[name]["counts"] = _forward(q, k, v, layouts[kind], rank, overlap, link)[0].pairs
        for i in range(repeats):
            for name, (kind, overlap, link) in variants.items():
                trace, compute, step = _forward(q, k, v, layouts[kind], rank, overlap, link)
                spans = _spans(trace, rank)
                out[name]["spans"] = spans
                out[name]["compute"].append(compute)
                out[name]["step"].append(step)
                out[name]["overlap"].append(overlap_share(spans, trace.flights("K/V")))
                out[name]["wait"].append(sum(e.end - e.start for e in trace.spans("wait K/V")))
            progress(i + 1, repeats, "repeats")
    return out


def count_work(world_size, seq=2048, heads=4, head_dim=16, seed=0):
    """An untimed run of both splits (one forward each, ``repeats=0``), at any number of ranks,
    even more than cores: per split, ``pairs`` and ``blocks`` counted per rank."""
    for kind in LAYOUTS:
        RingLayout(seq, world_size, kind)
    per_rank = launch(balance_worker, world_size=world_size, seq=seq, heads=heads,
                      head_dim=head_dim, repeats=0, seed=seed, variants=LAYOUTS,
                      warn_oversubscription=False)
    return {kind: {"pairs": [r[kind]["counts"]["pairs"] for r in per_rank],
                   "blocks": [r[kind]["counts"]["blocks"] for r in per_rank]} for kind in LAYOUTS}


def run(world_size, seq=2048, heads=4, head_dim=16, repeats=7, seed=0):
    """``balance_worker`` on ``world_size`` ranks (sizes checked before launch). Returns per
    variant: ``pairs`` and ``blocks`` (counted, per rank), ``compute`` (Stats per rank),
    ``step`` (Stats over rounds of the slowest rank's forward), ``overlap`` (Stats over rounds
    of the ranks' covered / in-flight seconds: near 1 by construction when hops are posted
    before computing, so it shows the schedule, not hiding), ``hops`` and ``wait`` (Stats over
    rounds of the slowest rank's K/V seconds from post to arrival, and waiting for them; in the
    serial variant a hop is waited for at once, so ``hops`` is its exposed transfer time),
    ``spans`` (all ranks' last round). The ranks
    ran every round in lock-step, so all these Stats are paired round by round. Refuses more
    ranks than cores: ranks sharing a core time the scheduler, not the ring."""
    for kind in LAYOUTS:
        RingLayout(seq, world_size, kind)
    if world_size > cpu_count():
        raise ValueError(f"world_size={world_size} ranks on {cpu_count()} cores would share "
                         f"cores, and their times would measure the scheduler: time the ring "
                         f"at world_size <= {cpu_count()}, and use count_work({world_size}, ...) "
                         f"for the untimed counts")
    if repeats < 1:
        raise ValueError(f"run times repeats >= 1 rounds; got {repeats} (count_work counts "
                         f"without timing)")
    per_rank = launch(balance_worker, world_size=world_size, seq=seq, heads=heads,
                      head_dim=head_dim, repeats=repeats, seed=seed)
    result, rounds = {}, f"ring_timing.run {time.time_ns()}"   # every Stats below: paired
    for name in VARIANTS:
        ranks = [r[name] for r in per_rank]
        shares = [sum(r["overlap"][i][0] for r in ranks) / sum(r["overlap"][i][1] for r in ranks)
                  for i in range(repeats)] if world_size > 1 else [0.0]
        result[name] = {"pairs": [r["counts"]["pairs"] for r in ranks],
                        "blocks": [r["counts"]["blocks"] for r in ranks],
                        "compute": [Stats.of(r["compute"], rounds) for r in ranks],
                        "step": Stats.of(slowest([r["step"] for r in ranks]), rounds),
                        "overlap": Stats.of(shares, rounds),
                        # per round, the slowest rank's: K/V hops from post to arrival (in the
                        # serial variant all of it is exposed), and its waits for them
                        "hops": Stats.of(slowest([[o[1] for o in r["overlap"]] for r in ranks]),
                                         rounds),
                        "wait": Stats.of(slowest([r["wait"] for r in ranks]), rounds),
                        "spans": [s for r in ranks for s in r["spans"]]}
    return result


def slowest_words(compute):
    """Which rank's attention took longest (by median) and how it compares with the fastest:
    the ranks timed each round in lock-step, so the rounds pair and the interval of the
    per-round ratio chooses the words. One sentence."""
    slow = max(range(len(compute)), key=lambda r: compute[r].median)
    fast = min(range(len(compute)), key=lambda r: compute[r].median)
    c = compare(compute[slow], compute[fast])          # paired: the same rounds
    words = dict(slow=slow, fast=fast, slow_time=compute[slow].fmt("ms", 1e3),
                 fast_time=compute[fast].fmt("ms", 1e3), comparison=c.fmt())
    # one whole template per verdict, so that a translation can order its words
    if c.resolved and c.ratio > 1:
        return tr("rank {slow} was the slowest ({slow_time}); it was slower than rank {fast} "
                  "({fast_time}): {comparison}", **words)
    if c.resolved:    # the larger median, yet smaller round by round
        return tr("rank {slow} was the slowest ({slow_time}); it was faster than rank {fast} "
                  "({fast_time}): {comparison}", **words)
    return tr("rank {slow} was the slowest ({slow_time}); it was not measurably different "
              "from rank {fast} ({fast_time}): {comparison}", **words)


def slowest_per_round(compute):
    """Stats over rounds of the slowest rank's attention time (``compute``: Stats per rank)."""
    return Stats.of(slowest([list(t.values) for t in compute]), compute[0].rounds)
