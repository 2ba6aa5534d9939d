"""What labs 03a1 and 03a2 run with the collectives: every collective before and after, the messages and
bytes of each from-scratch all-reduce (counted at the dispatcher by ``count_collectives``, not
by the algorithms), and all-reduce time against message size, the variants interleaved round
by round (``bench/collectives.py`` too)."""
from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter

import torch
import torch.distributed as dist

from labutils.core.commcount import count_collectives
from labutils.core.launcher import launch
from labutils.core.rank import progress
from labutils.core.timing import Stats, slowest_rank
from labutils.cost.costmodel import get_link
from labutils.parallel.collective_demo import COLLECTIVES, collectives_worker
from labutils.parallel.collectives import ALL_REDUCES
from labutils.parallel.emulation import emulate

KiB, MiB = 2 ** 10, 2 ** 20


def run_collectives(world_size=4, names=COLLECTIVES, n=3):
    """Run each collective on ``world_size`` real ranks; {name: ([before per rank], [after])}."""
    unknown = [x for x in names if x not in COLLECTIVES]
    if unknown:
        raise ValueError(f"unknown collective(s) {unknown}; use names from {COLLECTIVES}")
    if world_size < 2:
        raise ValueError(f"collectives need world_size >= 2 to show anything; got {world_size}")
    # 4 tiny ranks on 2 cores are fine here: nothing is timed
    per_rank = launch(collectives_worker, list(names), n, world_size=world_size,
                      warn_oversubscription=False)
    return {name: ([r[name][0] for r in per_rank], [r[name][1] for r in per_rank])
            for name in names}


# ---- counted messages ----------------------------------------------------------------------

def message_steps(calls):
    """Message steps in one rank's point-to-point ``calls`` (in issue order): a receive, with
    the send posted just before it (it travels meanwhile), or a send that no receive follows.
    The latency an all-reduce pays is its busiest rank's count."""
    ops = [c.op for c in calls if c.is_p2p]
    return sum(1 for i, op in enumerate(ops)
               if op != "send" or i + 1 == len(ops) or ops[i + 1] == "send")


def _trace_worker(rank, world_size, names, numel, against_gloo=False):
    out = {}
    for name in names:
        x = torch.ones(numel)
        with count_collectives() as counted:
            ALL_REDUCES[name](x)
        assert torch.all(x == world_size), f"{name} did not sum"
        out[name] = [(c.op, c.peer, c.nbytes) for c in counted.calls], message_steps(counted.calls)
        if against_gloo:
            out[name] += (_agrees_with_gloo(rank, name, numel),)
    return out


def _agrees_with_gloo(rank, name, numel):
    """Does ``name`` give exactly ``dist.all_reduce``'s result on this rank? Small integers in
    fp32: every order of the sum is exact, so "equal" can mean bit-equal."""
    x = torch.randint(-1000, 1000, (numel,), generator=torch.Generator().manual_seed(rank)).float()
    expected, got = x.clone(), x.clone()
    dist.all_reduce(expected)
    ALL_REDUCES[name](got)
    return torch.equal(got, expected)


def trace_all_reduce(world_size, numel, names=("ring", "recursive_doubling", "root"),
                     against_gloo=False):
    """Run each from-scratch all-reduce once on ``world_size`` ranks, counting what it sends.

    Returns {name: {"steps": [message steps per rank], "sent": [bytes sent per rank],
    "received": [bytes received per rank], "link": Counter {(src, dst): bytes}}}, every figure
    from the calls the dispatcher saw (``message_steps`` says what a step is). With
    ``against_gloo`` each also runs once more, uncounted, on integer-valued data and
    ``"agrees"`` says whether every rank got exactly ``dist.all_reduce``'s result.
    """
    bad = [x for x in names if x not in ALL_REDUCES or x == "gloo"]
    if bad:
        raise ValueError(f"can only trace the from-scratch all-reduces; got {bad}")
    # nothing is timed: oversubscribed ranks only count here
    per_rank = launch(_trace_worker, list(names), int(numel), bool(against_gloo),
                      world_size=world_size, warn_oversubscription=False)
    out = {}
    for name in names:
        calls = [r[name][0] for r in per_rank]
        link = Counter()
        for src, rank_calls in enumerate(calls):
            for op, peer, nbytes in rank_calls:
                if op == "send":
                    link[(src, peer)] += nbytes
        out[name] = dict(steps=[r[name][1] for r in per_rank],
                         sent=[sum(b for op, _, b in c if op == "send") for c in calls],
                         received=[sum(b for op, _, b in c if op == "recv_") for c in calls],
                         link=link)
        if against_gloo:
            out[name]["agrees"] = all(r[name][2] for r in per_rank)
    return out


# ---- measured cost -------------------------------------------------------------------------

def round_order(impls, i):
    """The impls' order in round ``i``: rotated by one each round, so that no impl always runs
    first or always right after the same other one (caches, scheduler state carry over)."""
    shift = i % len(impls)
    return list(impls[shift:]) + list(impls[:shift])


def time_all_reduce_worker(rank, world_size, sizes, impls=("gloo",), repeats=5, warmup=1,
                           calls=1, budget_s=None, max_repeats=40, link=None):
    """Time each all-reduce in ``impls`` at each size (bytes, fp32), interleaved round by round.

    One round times every size and every impl once, so round i of all of them ran side by
    side (a busy moment of the machine hits a whole round); the impls' order rotates by one
    each round. A sample is ``calls`` back-to-back
    calls after a barrier, divided by ``calls`` (with one call a sample mostly measures which
    rank left the barrier last, as nccl-tests knows), and its time is the slowest rank's (an
    all-reduce ends when the last rank has the result). ``budget_s``: after ``repeats`` rounds,
    more rounds until that many seconds have passed (at most ``max_repeats``). ``link``: time
    on an emulated link (``parallel.emulation.emulate``) instead of this machine's loopback.
    Returns {impl: [seconds lists, one per size]}.
    """
    xs = [torch.zeros(max(1, nbytes // 4)) for nbytes in sizes]  # zeros: sums never overflow
    times = {impl: [[] for _ in sizes] for impl in impls}
    target = repeats if budget_s is None else max_repeats
    start, i, more = time.perf_counter(), 0, torch.ones(1)
    while more.item():
        progress(min(i + 1, warmup + repeats), warmup + repeats, "repeats")
        for k, x in enumerate(xs):
            for impl in round_order(impls, i):  # round-robin, so machine noise hits every variant alike
                dist.barrier()
                with emulate(link) if link is not None else contextlib.nullcontext():
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        ALL_REDUCES[impl](x)
                    t = (time.perf_counter() - t0) / calls
                if i >= warmup:
                    times[impl][k].append(t)
        i += 1
        done = i - warmup
        go_on = done < repeats or (done < target and budget_s is not None
                                   and time.perf_counter() - start < budget_s)
        more = torch.tensor([float(go_on)])
        dist.broadcast(more, 0)  # rank 0's clock decides, so every rank runs the same rounds
    return {impl: [slowest_rank(ts) for ts in times[impl]] for impl in impls}


def measure_all_reduce(sizes, world_size=2, impls=("gloo", "ring", "recursive_doubling"),
                       repeats=5, warmup=1, calls=1, budget_s=None, link=None):
    """All-reduce time against message size on real ranks: {impl: [Stats per size]}. All the
    Stats share one set of rounds (round i of every size and impl ran side by side):
    ``lu.timing.compare(st["ring"][k], st["gloo"][k])`` takes the per-round ratio. ``link``
    (a name in ``costmodel.LINKS``, a ``Link`` or ``(alpha, beta)``): every message takes its
    emulated time on that link instead (labelled emulated; see ``parallel.emulation``)."""
    bad = [i for i in impls if i not in ALL_REDUCES]
    if bad:
        raise ValueError(f"unknown all-reduce {bad}; use names from {list(ALL_REDUCES)}")
    if world_size < 2:
        raise ValueError(f"all-reduce time needs world_size >= 2; got {world_size}")
    if any(int(s) < 4 for s in sizes):
        raise ValueError(f"sizes are bytes of fp32 data, each >= 4; got {list(sizes)}")
    if link is not None and "gloo" in impls:
        raise ValueError("gloo's all-reduce would only wait out the model's time on an emulated "
                         "link; emulate the from-scratch algorithms, whose messages are real")
    link = None if link is None else get_link(link)
    res = launch(time_all_reduce_worker, [int(s) for s in sizes], list(impls), repeats, warmup,
                 int(calls), budget_s, 40, link, world_size=world_size, timeout=600)[0]
    rounds = uuid.uuid4().hex   # one set of paired rounds for every size and impl
    return {impl: [Stats.of(v, rounds=rounds) for v in res[impl]] for impl in impls}
