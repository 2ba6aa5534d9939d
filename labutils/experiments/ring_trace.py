"""Ring attention observed from outside (06d2): what each rank's ring did, in order, without a
line of recording in ``parallel/ring_attention.py``.

``trace_ring()`` is a context manager that wraps, for the duration of the block, the three
functions the ring is made of (``ring_shift``, ``wait`` and the block compute
``attend_chunks``/``attend_chunks_backward``) with timed versions. A ``Trace`` then holds one
``Event`` per post, compute and wait, in the order the rank did them, with its clocks; the
visible query-key pairs and chunk pairs are counted afterwards from the chunk ranges each compute
was given (the same masks the ring used). The bytes and calls on the wire come from the
dispatcher (``core.commcount.count_collectives``), not from here: ``sends_by_stream`` splits the
counted sends into the K/V and dK/dV streams by the posts' order (one send per post).

* ``equality_worker``: ring attention's output and gradients beside the single-process
  reference, with the forward's and the backward's traces and counted collectives.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from labutils.core.commcount import count_collectives
from labutils.parallel import ring_attention as ra
from labutils.parallel.online_softmax import causal_mask


@dataclass
class Event:
    what: str            # "post K/V", "compute", "wait K/V", "post dK/dV", "wait dK/dV"
    start: float         # perf_counter
    end: float
    label: str = ""      # a compute's source rank (whose key block)
    chunks: tuple = ()   # a compute's (query ranges, key ranges)


@dataclass
class Trace:
    """One rank's ring, as observed: ``events`` in order."""
    events: list = field(default_factory=list)

    def order(self):
        return [e.what for e in self.events]

    def spans(self, name):
        return [e for e in self.events if e.what == name]

    @property
    def pairs(self):
        """Visible query-key pairs and chunk pairs computed, from the computes' chunk ranges."""
        pairs = blocks = 0
        for e in self.spans("compute"):
            for qr in e.chunks[0]:
                for kr in e.chunks[1]:
                    n = int(causal_mask(torch.arange(qr.start, qr.stop),
                                        torch.arange(kr.start, kr.stop)).sum())
                    pairs, blocks = pairs + n, blocks + (n > 0)
        return {"pairs": pairs, "blocks": blocks}

    def flights(self, stream="K/V"):
        """(posted, waited-for) of each transfer of ``stream``: the i-th post to the end of the
        i-th wait (the ring waits for its hops in the order it posts them)."""
        return [(p.start, w.end) for p, w in zip(self.spans(f"post {stream}"),
                                                 self.spans(f"wait {stream}"))]


@contextlib.contextmanager
def trace_ring(layout=None):
    """Record what ``ring_attention`` does inside the block (this process). With ``layout``,
    each compute is labelled with the rank whose key block it used."""
    trace = Trace()
    real = {name: getattr(ra, name) for name in
            ("ring_shift", "wait", "attend_chunks", "attend_chunks_backward")}
    streams = {}    # id of a posted request list -> its stream

    def src_of(k_chunks):
        if layout is None:
            return ""
        return next((str(r) for r in range(layout.world_size) if layout.chunks(r) == k_chunks),
                    "")

    def ring_shift(t, rank_, world_size, tag, group=None):
        t0 = time.perf_counter()
        reqs, buf = real["ring_shift"](t, rank_, world_size, tag, group)
        if reqs:
            streams[id(reqs)] = ra.STREAMS[tag]
            trace.events.append(Event(f"post {ra.STREAMS[tag]}", t0, time.perf_counter()))
        return reqs, buf

    def wait(reqs):
        t0 = time.perf_counter()
        real["wait"](reqs)
        if reqs:
            trace.events.append(Event(f"wait {streams[id(reqs)]}", t0, time.perf_counter()))

    def timed(fn):
        def compute(q, k, v, q_chunks, k_chunks, *rest):
            t0 = time.perf_counter()
            out = fn(q, k, v, q_chunks, k_chunks, *rest)
            trace.events.append(Event("compute", t0, time.perf_counter(), src_of(k_chunks),
                                      (tuple(q_chunks), tuple(k_chunks))))
            return out
        return compute

    wrapped = {"ring_shift": ring_shift, "wait": wait,
               "attend_chunks": timed(real["attend_chunks"]),
               "attend_chunks_backward": timed(real["attend_chunks_backward"])}
    for name, fn in wrapped.items():
        setattr(ra, name, fn)
    try:
        yield trace
    finally:
        for name, fn in real.items():
            setattr(ra, name, fn)


def sends_by_stream(trace, counted):
    """{stream: {"calls", "bytes"}} of the sends the dispatcher counted, each attributed to the
    stream of the post that issued it (one send per post, in order)."""
    posts = [e.what.removeprefix("post ") for e in trace.events if e.what.startswith("post ")]
    sends = counted.sends
    if len(sends) != len(posts):
        raise AssertionError(f"{len(posts)} posts but {len(sends)} sends counted")
    out = {}
    for stream, call in zip(posts, sends):
        s = out.setdefault(stream, {"calls": 0, "bytes": 0})
        s["calls"] += 1
        s["bytes"] += call.nbytes
    return out


def equality_worker(rank, world_size, seq, kind, heads=4, head_dim=16, seed=0):
    """Ring attention's output and q/k/v gradients on this rank, beside the single-process
    reference's same positions (float64). Returns (ring, reference, observed): dicts of tensors,
    and per phase ("forward", "backward") the event order and the sends per stream counted by
    the dispatcher."""
    layout = ra.RingLayout(seq, world_size, kind)
    q, k, v, dout = ra.qkv(seq, heads, head_dim, seed=seed)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    y = ra.reference_attention(*full)
    y.backward(dout)
    mine = [layout.shard(t, rank).requires_grad_() for t in (q, k, v)]
    traces, counted = {}, {}
    with count_collectives() as counted["forward"], trace_ring() as traces["forward"]:
        out = ra.ring_attention(*mine, layout, rank)
    with count_collectives() as counted["backward"], trace_ring() as traces["backward"]:
        out.backward(layout.shard(dout, rank))
    names = ("out", "dq", "dk", "dv")
    ring = dict(zip(names, [out.detach()] + [t.grad for t in mine]))
    ref = dict(zip(names, [layout.shard(t, rank) for t in [y.detach()] + [t.grad for t in full]]))
    observed = {ph: {"order": traces[ph].order(),
                     "sends": sends_by_stream(traces[ph], counted[ph]),
                     "ops": dict(counted[ph].by_op)} for ph in traces}
    return ring, ref, observed
