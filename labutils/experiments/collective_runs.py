"""What lab 03a runs with the collectives: every collective before and after, the messages and
bytes of each from-scratch all-reduce (counted at the dispatcher by ``count_collectives``, not
by the algorithms), and all-reduce time against message size, the variants interleaved round
by round (``bench/collectives.py`` too)."""
from __future__ import annotations

import time
import uuid
from collections import Counter

import torch
import torch.distributed as dist

from labutils.core.commcount import count_collectives
from labutils.core.launcher import launch
from labutils.core.rank import progress
from labutils.core.timing import Stats, slowest_rank
from labutils.parallel.collective_demo import COLLECTIVES, collectives_worker
from labutils.parallel.collectives import ALL_REDUCES

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


def _trace_worker(rank, world_size, names, numel):
    out = {}
    for name in names:
        x = torch.ones(numel)
        with count_collectives() as counted:
            ALL_REDUCES[name](x)
        assert torch.all(x == world_size), f"{name} did not sum"
        out[name] = [(c.op, c.peer, c.nbytes) for c in counted.calls], message_steps(counted.calls)
    return out


def trace_all_reduce(world_size, numel, names=("ring", "recursive_doubling", "root")):
    """Run each from-scratch all-reduce once on ``world_size`` ranks, counting what it sends.

    Returns {name: {"steps": [message steps per rank], "sent": [bytes sent per rank],
    "received": [bytes received per rank], "link": Counter {(src, dst): bytes}}}, every figure
    from the calls the dispatcher saw (``message_steps`` says what a step is).
    """
    bad = [x for x in names if x not in ALL_REDUCES or x == "gloo"]
    if bad:
        raise ValueError(f"can only trace the from-scratch all-reduces; got {bad}")
    # nothing is timed: oversubscribed ranks only count here
    per_rank = launch(_trace_worker, list(names), int(numel), world_size=world_size,
                      warn_oversubscription=False)
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
    return out


# ---- measured cost -------------------------------------------------------------------------

def time_all_reduce_worker(rank, world_size, sizes, impls=("gloo",), repeats=5, warmup=1,
                           calls=1):
    """Time each all-reduce in ``impls`` at each size (bytes, fp32), interleaved round by round.

    A sample is ``calls`` back-to-back calls after a barrier, divided by ``calls`` (with one
    call a sample mostly measures which rank left the barrier last, as nccl-tests knows), and
    its time is the slowest rank's (an all-reduce ends when the last rank has the result).
    Round i of every impl ran side by side. Returns {impl: [seconds lists, one per size]}.
    """
    out = {impl: [] for impl in impls}
    for nbytes in sizes:
        x = torch.zeros(max(1, nbytes // 4))  # zeros: repeated sums never overflow
        times = {impl: [] for impl in impls}
        for i in range(warmup + repeats):
            progress(i + 1, warmup + repeats, "repeats")  # rank 0 drives a panel's bar
            for impl in impls:  # round-robin, so machine noise hits every algorithm alike
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    ALL_REDUCES[impl](x)
                if i >= warmup:
                    times[impl].append((time.perf_counter() - t0) / calls)
        for impl in impls:
            out[impl].append(slowest_rank(times[impl]))
    return out


def measure_all_reduce(sizes, world_size=2, impls=("gloo", "ring", "recursive_doubling"),
                       repeats=5, warmup=1, calls=1):
    """All-reduce time against message size on real ranks: {impl: [Stats per size]}. The Stats
    of one size are paired round by round: ``lu.timing.compare(st["ring"][k], st["gloo"][k])``
    takes the per-round ratio."""
    bad = [i for i in impls if i not in ALL_REDUCES]
    if bad:
        raise ValueError(f"unknown all-reduce {bad}; use names from {list(ALL_REDUCES)}")
    if world_size < 2:
        raise ValueError(f"all-reduce time needs world_size >= 2; got {world_size}")
    if any(int(s) < 4 for s in sizes):
        raise ValueError(f"sizes are bytes of fp32 data, each >= 4; got {list(sizes)}")
    res = launch(time_all_reduce_worker, [int(s) for s in sizes], list(impls), repeats, warmup,
                 int(calls), world_size=world_size, timeout=600)[0]
    rounds = [uuid.uuid4().hex for _ in sizes]   # one set of paired rounds per size
    return {impl: [Stats.of(v, rounds=r) for v, r in zip(res[impl], rounds)] for impl in impls}
