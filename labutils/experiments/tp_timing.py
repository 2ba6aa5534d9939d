"""Tensor parallelism timed (06b, ``bench tensor_parallel``): one transformer layer's training
step (forward and backward) on one rank, tensor-parallel on the ranks and data-parallel on the
ranks, with the same global batch, interleaved; each variant's all-reduces and their bytes
counted; a few steps of TP and of DP recorded as per-rank spans (compute, and every all-reduce
from launch to result: TP's from the dispatcher, ``core.commcount``, so the layer itself records
nothing).

* ``step_worker``: the timing, the counts and an equality check of both parallel steps;
* ``timeline_worker``: the spans, drawn by ``lu.timeline_plot.plot_overlap``;
* ``comm_summary``: from one step's spans, how long all-reduces were in flight and how much of
  that time the compute waited; ``comm_stats``: the same over the recorded steps, with spread;
* ``run``: both, on ``world_size`` ranks.

DP is PyTorch's ``DistributedDataParallel`` in both workers, with the same buckets: the timeline
records its bucket all-reduces through a DDP communication hook.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from labutils.core.commcount import count_collectives
from labutils.core.launcher import launch
from labutils.core.rank import progress
from labutils.core.timeline import Timeline
from labutils.core.timing import Stats, slowest_rank
from labutils.parallel.tensor_parallel import (
    ParallelTransformerLayer,
    TPLayout,
    TransformerLayer,
    reference_shards,
    validate_tp_config,
)

VARIANTS = ("1 rank", "TP", "DP")


def _data(hidden, num_heads, batch, seq, seed):
    torch.manual_seed(seed)   # every rank builds the same layer, batch and upstream gradient
    return TransformerLayer(hidden, num_heads), torch.randn(batch, seq, hidden), \
        torch.randn(batch, seq, hidden)


def _input(x):
    # the layer sits inside a stack: its input needs a gradient, which is what f's backward
    # all-reduces (with a leaf input autograd would skip that all-reduce of the first block)
    return x.detach().requires_grad_()


def _step(model, x, dy):
    """One training step's compute: forward, then backward from the upstream gradient ``dy``."""
    model.zero_grad(set_to_none=True)
    y = model(_input(x))
    (y * dy).sum().backward()
    return y


def _counted_step(model, x, dy):
    """All-reduces this rank issues in forward and in backward, and the bytes handed to them
    (``core.commcount``): ``((forward, backward) calls, (forward, backward) bytes)``."""
    model.zero_grad(set_to_none=True)
    with count_collectives() as fwd:
        y = model(_input(x))
    with count_collectives() as bwd:
        (y * dy).sum().backward()
    return ((fwd.all_reduces, bwd.all_reduces),
            tuple(sum(c.nbytes for c in k.of("allreduce")) for k in (fwd, bwd)))


def _builds(rank, world_size, hidden, num_heads, batch, seq, bucket_cap_mb, seed):
    """The three variants on this rank: model, its input, its upstream gradient."""
    ref, x, dy = _data(hidden, num_heads, batch, seq, seed)
    one = TransformerLayer(hidden, num_heads)
    one.load_state_dict(ref.state_dict())
    tp = ParallelTransformerLayer(ref, TPLayout(rank, world_size))
    dp = TransformerLayer(hidden, num_heads)
    dp.load_state_dict(ref.state_dict())
    mine = slice(rank * batch // world_size, (rank + 1) * batch // world_size)
    dp = DistributedDataParallel(dp, bucket_cap_mb=bucket_cap_mb)
    return {"1 rank": (one, x, dy), "TP": (tp, x, dy), "DP": (dp, x[mine], dy[mine])}


def _equal_to_one_rank(rank, world_size, builds):
    """TP's output and gradient slices, and DP's averaged gradients (times world_size: each
    rank's loss sums half the batch), equal to the one-rank step's."""
    one, x, dy = builds["1 rank"]
    y = _step(one, x, dy)
    ref = dict(one.named_parameters())
    tp, _, _ = builds["TP"]
    ok = torch.allclose(_step(tp, x, dy), y, atol=1e-4, rtol=1e-4)
    layout = TPLayout(rank, world_size)
    for name, p in tp.named_parameters():
        ok &= torch.allclose(p.grad, reference_shards(name, ref[name].grad, layout),
                             atol=1e-4, rtol=1e-4)
    dp, xd, dyd = builds["DP"]
    _step(dp, xd, dyd)
    dp_ok = all(torch.allclose(p.grad * world_size, ref[n.removeprefix("module.")].grad,
                               atol=1e-4, rtol=1e-4) for n, p in dp.named_parameters())
    return bool(ok), dp_ok


def step_worker(rank, world_size, hidden=256, num_heads=8, batch=8, seq=64, repeats=7,
                bucket_cap_mb=1.0, seed=0):
    """Seconds per training step of each variant, interleaved (1 rank, TP, DP, 1 rank, ...):
    ``"1 rank"`` is rank 0 alone on the whole batch (the others wait at a barrier); ``"TP"``
    every rank on the whole batch with 1/p of the weights; ``"DP"`` (PyTorch's DDP) every rank on
    1/p of the batch with all the weights. A step ends when its slowest rank does. Returns
    ``{"stats": {variant: Stats (paired round by round)}, "calls": {variant: (forward, backward) all-reduces},
    "bytes": {variant: (forward, backward) bytes handed to them}, "tp_equal", "dp_equal",
    "threads"}`` (``threads``: this rank's intra-op threads)."""
    builds = _builds(rank, world_size, hidden, num_heads, batch, seq, bucket_cap_mb, seed)
    tp_equal, dp_equal = _equal_to_one_rank(rank, world_size, builds)
    calls, nbytes = {}, {}
    for v in ("TP", "DP"):
        for _ in range(2):   # warm-up; DDP rebuilds its buckets in the second forward
            _step(*builds[v])
        calls[v], nbytes[v] = _counted_step(*builds[v])
    calls["1 rank"], nbytes["1 rank"] = _counted_step(*builds["1 rank"])
    times = {v: [] for v in VARIANTS}
    for i in range(repeats + 1):
        progress(i, repeats, "repeats")          # rank 0 drives a panel's bar
        for v in VARIANTS:
            dist.barrier()
            t0 = time.perf_counter()
            if v != "1 rank" or rank == 0:
                _step(*builds[v])
            if i:                                # the first round warms up
                times[v].append(time.perf_counter() - t0)
    rows = slowest_rank([times[v] for v in VARIANTS])   # the max over ranks, per sample
    rounds = f"tp_timing.step_worker {time.time_ns()}"   # one set of rounds: the Stats pair up
    return {"stats": {v: Stats.of(r, rounds) for v, r in zip(VARIANTS, rows)}, "calls": calls,
            "bytes": nbytes, "tp_equal": tp_equal, "dp_equal": dp_equal,
            "threads": torch.get_num_threads()}


def _compute_between(tl, name, start, end, label):
    """Spans ``name`` for [start, end] less the all-reduces recorded inside it, and a ``wait``
    span (the compute lane idle) over each of those all-reduces."""
    comm = sorted((s for s in tl.spans if s.name == "allreduce" and start <= s.start < end),
                  key=lambda s: s.start)
    t = start
    for s in comm:
        tl.add(name, t, s.start, label=label)
        tl.add("wait", s.start, s.end)
        t = s.end
    tl.add(name, t, end, label=label)


def _add_all_reduces(timeline, counted, label):
    """One ``allreduce`` span per all-reduce the dispatcher saw, from its launch to the moment
    gloo completed it (``core.commcount``'s two clocks)."""
    for c in counted.of("allreduce"):
        timeline.add("allreduce", c.launched, c.completed or c.launched, label=label)


def _recording_hook(timeline, world_size):
    """A DDP communication hook that averages a bucket as DDP's default does and records one
    ``allreduce`` span per bucket, from its launch (in backward, when the bucket is full) to the
    moment gloo completes it (the future's callback runs then, on gloo's thread)."""
    def hook(state, bucket):
        t0 = time.perf_counter()
        fut = dist.all_reduce(bucket.buffer().div_(world_size), async_op=True).get_future()

        def done(f):
            timeline.add("allreduce", t0, time.perf_counter(), label=f"b{bucket.index()}")
            return f.value()[0]
        return fut.then(done)
    return hook


def timeline_worker(rank, world_size, hidden=256, num_heads=8, batch=8, seq=64,
                    bucket_cap_mb=1.0, seed=0, steps=5):
    """Spans of ``steps`` untimed steps of TP and of DP (PyTorch's DDP, the buckets of the timed
    step), interleaved after two warm-up steps: ``{"TP": [[Span] per step], "DP": [...]}``. TP
    calls ``dist.all_reduce`` and blocks until the sum arrives (the next operation needs it),
    so its compute lane shows a ``wait`` over each; DDP launches each bucket from backward and
    waits only at its end."""
    ref, x, dy = _data(hidden, num_heads, batch, seq, seed)
    mine = slice(rank * batch // world_size, (rank + 1) * batch // world_size)
    tl = {"TP": Timeline(rank), "DP": Timeline(rank)}
    dp = DistributedDataParallel(ref, bucket_cap_mb=bucket_cap_mb)
    dp.register_comm_hook(None, _recording_hook(tl["DP"], world_size))
    builds = {"TP": (ParallelTransformerLayer(ref, TPLayout(rank, world_size)), x, dy),
              "DP": (dp, x[mine], dy[mine])}
    out = {"TP": [], "DP": []}
    for i in range(2 + steps):   # two warm-ups: DDP rebuilds its buckets in the second forward
        for variant, (model, xs, dys) in builds.items():
            tl[variant].spans.clear()
            dist.barrier()
            xs = _input(xs)
            grad_done = []                       # when backward computed the layer's input grad
            xs.register_hook(lambda g: grad_done.append(time.perf_counter()))
            t0 = time.perf_counter()
            with count_collectives() as fwd:
                y = model(xs)
            t1 = time.perf_counter()
            with count_collectives() as bwd:
                (y * dys).sum().backward()
            t2 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            if i < 2:
                continue
            if variant == "TP":      # forward's all-reduces are g's, backward's f's
                _add_all_reduces(tl["TP"], fwd, "g")
                _add_all_reduces(tl["TP"], bwd, "f")
                _compute_between(tl["TP"], "forward", t0, t1, "fwd")
                _compute_between(tl["TP"], "backward", t1, t2, "bwd")
            else:   # compute ends with the input grad or the last bucket's launch; then DDP waits
                end = max(grad_done + [s.start for s in tl["DP"].spans])
                tl["DP"].add("forward", t0, t1, label="fwd")
                tl["DP"].add("backward", t1, end, label="bwd")
                tl["DP"].add("wait", end, t2)
            out[variant].append(list(tl[variant].spans))
    return out


def _merged(intervals):
    """Union of (start, end) intervals as disjoint sorted intervals: DP's buckets are in flight
    at the same time, and their time must not count twice."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def comm_summary(spans):
    """Per rank, from the spans of one step: ``step`` (first start to last end), ``in flight``
    (seconds during which at least one all-reduce was under way) and ``exposed`` (the share of
    that time during which the rank ran no forward or backward: its compute waited)."""
    out = {}
    for rank in sorted({s.rank for s in spans}):
        mine = [s for s in spans if s.rank == rank]
        busy = _merged((s.start, s.end) for s in mine if s.name in ("forward", "backward"))
        comm = _merged((s.start, s.end) for s in mine if s.name == "allreduce")
        total = sum(b - a for a, b in comm)
        covered = sum(max(0.0, min(b, d) - max(a, c)) for a, b in comm for c, d in busy)
        out[rank] = {"step": max(s.end for s in mine) - min(s.start for s in mine),
                     "in flight": total, "exposed": 1.0 - covered / total if total else 0.0}
    return out


def comm_stats(steps):
    """``comm_summary`` of each step (a list of span lists), as Stats per rank and quantity:
    ``{rank: {"step": Stats, "in flight": Stats, "exposed": Stats}}``."""
    summaries = [comm_summary(spans) for spans in steps]
    return {rank: {k: Stats.of([s[rank][k] for s in summaries]) for k in summaries[0][rank]}
            for rank in summaries[0]}


def run(world_size=2, hidden=256, num_heads=8, batch=8, seq=64, repeats=7, bucket_cap_mb=1.0,
        seed=0, timeline_steps=5):
    """``step_worker`` and ``timeline_worker`` on ``world_size`` ranks: the step results
    (``tp_equal``/``dp_equal`` true only if true on every rank); ``steps``, the spans of every
    rank per recorded step ``{"TP": [[Span], ...], "DP": [...]}``; ``spans``, the first of them
    (to draw)."""
    validate_tp_config(hidden, num_heads, world_size)
    if batch % world_size:
        raise ValueError(f"batch {batch} must divide by world_size {world_size}: data "
                         f"parallelism gives each rank an equal share of the global batch")
    args = (hidden, num_heads, batch, seq)
    timed = launch(step_worker, *args, repeats=repeats, bucket_cap_mb=bucket_cap_mb, seed=seed,
                   world_size=world_size)
    res = dict(timed[0])              # stats: already the slowest rank's, on every rank
    for key in ("tp_equal", "dp_equal"):
        res[key] = all(r[key] for r in timed)   # every rank's slices checked, not rank 0's
    if any(r["calls"] != res["calls"] or r["bytes"] != res["bytes"] for r in timed):
        raise AssertionError(f"ranks issued different all-reduces: "
                             f"{[(r['calls'], r['bytes']) for r in timed]}")
    per_rank = launch(timeline_worker, *args, bucket_cap_mb=bucket_cap_mb, seed=seed,
                      steps=timeline_steps, world_size=world_size)
    res["steps"] = {v: [[s for r in per_rank for s in r[v][k]] for k in range(timeline_steps)]
                    for v in ("TP", "DP")}
    res["spans"] = {v: res["steps"][v][0] for v in ("TP", "DP")}
    return res
