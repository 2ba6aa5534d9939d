"""Where a bucket's all-reduce time goes, and how much of it a step pays (04a, 04c).

``core.commcount.count_collectives`` gives each bucket's all-reduce two clocks: ``launched``
(the main thread hands it to gloo) and ``completed`` (gloo's thread finishes it). Between them
lie three different things, and this module splits them apart:

* **queue** ``[launched_b, start_b]``: the bucket waits behind earlier buckets;
* **peer wait** ``[start_b, max over ranks of start_b]``: this rank's gloo thread has started
  it and waits for the slowest peer to start it too;
* **transfer** ``[max over ranks of start_b, completed_b]``: both ranks are in it; bytes move
  and are summed.

``start_b`` is when the communication thread starts the bucket. The process group made by
``one_thread_group`` has a single gloo worker thread, which runs collectives one at a time in
the order they were launched; so ``start_b = max(launched_b, completed_{b-1})`` (bucket b-1's
completion is read on that same thread just before it takes the next one), and the peer-wait
and transfer spans of one rank never overlap. ``perf_counter`` is one clock for every process
on a machine, so starts of different ranks compare directly.

**Exposed communication** is what a step pays for communicating: the step time with
communication minus the step time of the same model with ``require_backward_grad_sync =
False`` (``no_sync``), timed in paired rounds (``exposed_worker``); a third variant launches
the same buckets only after backward (``AfterBackwardDDP``), to show what overlap buys.
"""
from __future__ import annotations

import os
import time
import uuid

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from scipy import stats as _st

from labutils.core.commcount import count_collectives
from labutils.core.i18n import N_
from labutils.core.rank import progress
from labutils.core.timeline import Span, Timeline
from labutils.core.timing import slowest_rank
from labutils.cost import costmodel, step_time
from labutils.data import models, workloads
from labutils.parallel.ddp import BucketedDDP

COMM_SPANS = ("queue", "peer wait", "transfer")


def one_thread_group():
    """A new gloo group of all ranks whose collectives run on one worker thread, in launch order.

    ``new_group(pg_options=...)`` ignores gloo's options in torch 2.13, so the group is made
    with a subclass of ``ProcessGroupGloo`` that sets ``_threads = 1`` (default 2)."""
    gloo = c10d.ProcessGroupGloo

    class OneThreadGloo(gloo):
        def __init__(self, store, rank, size, timeout):
            opts = gloo._Options()
            opts._threads, opts._timeout = 1, timeout
            # the interface the default group uses (GLOO_SOCKET_IFNAME, loopback under
            # lu.launch): create_default_device() would take the hostname's, off loopback
            ifname = os.environ.get("GLOO_SOCKET_IFNAME", "")
            opts._devices = [gloo.create_device(interface=ifname) if ifname
                             else gloo.create_default_device()]
            super().__init__(store, rank, size, opts)

    c10d.ProcessGroupGloo = OneThreadGloo
    try:
        return dist.new_group(backend="gloo")
    finally:
        c10d.ProcessGroupGloo = gloo


def thread_starts(calls):
    """``start_b = max(launched_b, completed_{b-1})`` for calls run in order by one thread."""
    starts, free_at = [], float("-inf")
    for c in calls:
        starts.append(max(c.launched, free_at))
        free_at = c.completed
    return starts


def split_calls(rank, calls, starts_by_rank, **meta):
    """Queue, peer-wait and transfer spans of this rank's ``calls`` (one step's buckets, in
    order); ``starts_by_rank[r][b]`` is bucket b's thread start on rank r."""
    spans = []
    for b, c in enumerate(calls):
        start = starts_by_rank[rank][b]
        everyone = max(s[b] for s in starts_by_rank)   # the last rank to start it
        label = f"b{b}"
        spans += [Span(rank, "queue", c.launched, start, label, dict(meta, nbytes=c.nbytes)),
                  Span(rank, "peer wait", start, everyone, label, dict(meta)),
                  Span(rank, "transfer", everyone, c.completed, label, dict(meta, nbytes=c.nbytes))]
    return spans


def _digits_ddp(bucket_cap_mb, width, group, cls=BucketedDDP):
    torch.manual_seed(0)
    return cls(models.DigitsCNN(channels=16 * width, hidden=64 * width),
               bucket_cap_mb=bucket_cap_mb, group=group)


def timeline_worker(rank, world_size, steps=3, bucket_cap_mb=0.1, width=4, batch_per_rank=64,
                    group=None):
    """Spans of ``steps`` training steps of the digits CNN with ``BucketedDDP`` on a one-thread
    gloo group: ``forward``; ``backward``, autograd's computation only; ``wait``, from there
    until every bucket is reduced and copied back; and per bucket ``queue``, ``peer wait`` and
    ``transfer`` (``split_calls``). Every span of step k has ``meta["step"] == k``. The
    dispatch mode that reads the clocks runs Python for every op of backward, so these steps
    are slower than untimed ones; ``exposed_worker`` times steps without it."""
    group = group or one_thread_group()
    tl = Timeline(rank)
    model = _digits_ddp(bucket_cap_mb, width, group)
    inner_wait = model.wait

    def timed_wait():   # autograd calls this at backward's end: the wait is measured outside
        with tl.span("wait"):
            inner_wait()
    model.wait = timed_wait
    wl = workloads.get("digits")
    X, y = wl.train_set
    xb, yb = X[:batch_per_rank], y[:batch_per_rank]
    for step in range(steps + 1):
        progress(step, steps, "steps")  # rank 0 drives a panel's bar
        dist.barrier()
        first = len(tl.spans)
        with tl.span("forward", label=f"{step}"):
            loss = wl.loss_fn(model(xb), yb)
        start = time.perf_counter()
        with count_collectives() as counted:
            loss.backward()   # returns after the wait, which autograd runs at its end
        wait = tl.spans[-1]
        tl.add("backward", start, wait.start, label=f"{step}")
        calls = [c for c in counted.of("allreduce") if c.group == group.group_name]
        starts = [None] * world_size
        dist.all_gather_object(starts, thread_starts(calls))   # untimed, after the step
        if step == 0:
            del tl.spans[first:]    # the first step warms up
            continue
        tl.spans += split_calls(rank, calls, starts)
        for s in tl.spans[first:]:
            s.meta["step"] = step
    return list(tl.spans)


def span_shares(spans):
    """Share of the launch-to-completion time spent in each of ``COMM_SPANS``, over all buckets
    of all ranks and steps, and the share of transfer time that ran during backward's
    computation on its rank and step."""
    total = {n: sum(s.duration for s in spans if s.name == n) for n in COMM_SPANS}
    whole = sum(total.values())
    out = {n: (t / whole if whole else 0.0) for n, t in total.items()}
    backward = {(s.rank, s.meta["step"]): s for s in spans if s.name == "backward"}
    during = 0.0
    for s in spans:
        if s.name == "transfer":
            b = backward[(s.rank, s.meta["step"])]
            during += max(0.0, min(s.end, b.end) - max(s.start, b.start))
    out["transfer during backward"] = during / total["transfer"] if total["transfer"] else 0.0
    return out


class AfterBackwardDDP(BucketedDDP):
    """The same buckets, launched only once backward has finished: no overlap."""

    def _launch_ready(self):
        pass    # hold every bucket during backward ...

    def wait(self):
        if self._prepared:
            BucketedDDP._launch_ready(self)   # ... then send them all, in order
        super().wait()


def exposed_worker(rank, world_size, bucket_cap_mb=0.1, rounds=15, width=4, batch_per_rank=64,
                   group=None):
    """Per round, seconds of one step (zero_grad, forward, backward) of the slowest rank, for
    ``"sync"`` (``BucketedDDP``), ``"no_sync"`` (the same model, ``require_backward_grad_sync
    = False``) and ``"after backward"`` (``AfterBackwardDDP``): ``{variant: [seconds, ...]}``,
    paired (round i of each ran side by side, order rotated each round), plus ``"buckets"``.
    ``group``: by default a ``one_thread_group``, as ``timeline_worker``'s."""
    group = group or one_thread_group()
    model = _digits_ddp(bucket_cap_mb, width, group)
    after = _digits_ddp(bucket_cap_mb, width, group, AfterBackwardDDP)
    wl = workloads.get("digits")
    X, y = wl.train_set
    xb, yb = X[:batch_per_rank], y[:batch_per_rank]

    def step(m, sync):
        m.require_backward_grad_sync = sync
        m.zero_grad(set_to_none=True)
        wl.loss_fn(m(xb), yb).backward()

    out = paired_rounds({"sync": lambda: step(model, True), "no_sync": lambda: step(model, False),
                         "after backward": lambda: step(after, True)}, rounds)
    out["buckets"] = len(model.buckets)
    return out


def paired_rounds(variants, rounds):
    """Inside a rank: time every ``variants[name]()`` once per round, in an order rotated each
    round, after a barrier; round 0 warms up. Returns ``{name: [seconds of the slowest rank,
    ...]}`` (a step ends when its slowest rank does) and a ``"rounds id"`` that pairs them."""
    names = list(variants)
    times = {n: [] for n in names}
    for i in range(rounds + 1):
        progress(i, rounds, "rounds")
        for k in range(len(names)):
            name = names[(i + k) % len(names)]   # rotate: no variant always runs first
            dist.barrier()
            t0 = time.perf_counter()
            variants[name]()
            if i:   # round 0 warms up
                times[name].append(time.perf_counter() - t0)
    out = dict(zip(names, slowest_rank([times[n] for n in names])))
    out["rounds id"] = uuid.uuid4().hex
    return out


def bucket_worker(rank, world_size, bucket_cap_mb=0.1, steps=3, rounds=15, width=4,
                  batch_per_rank=64):
    """Both measurements in one launch, on one one-thread group: ``exposed_worker``'s result
    with the ``timeline_worker`` spans under ``"spans"``."""
    group = one_thread_group()
    spans = timeline_worker(rank, world_size, steps, bucket_cap_mb, width, batch_per_rank, group)
    out = exposed_worker(rank, world_size, bucket_cap_mb, rounds, width, batch_per_rank, group)
    return dict(out, spans=spans)


def median_interval(values, confidence=0.95):
    """Median of ``values`` and its order-statistic interval (``scipy.stats.quantile_test``);
    nan bounds when too few values reach the confidence."""
    v = np.asarray(values, dtype=float)
    ci = _st.quantile_test(v, q=float(np.median(v)), p=0.5).confidence_interval(confidence)
    return float(np.median(v)), float(ci.low), float(ci.high)


def exposed(per_round):
    """From ``exposed_worker``'s result: (median, lo, hi) seconds of exposed communication
    (sync - no_sync per round) and of what overlap saves (after backward - sync per round)."""
    s, n, a = (np.asarray(per_round[k]) for k in ("sync", "no_sync", "after backward"))
    return median_interval(s - n), median_interval(a - s)


def bucket_profile(spans):
    """What the cost model needs, read off ``timeline_worker``'s spans (all ranks and steps):
    ``nbytes`` per bucket; ``ready``, the median fraction of backward that had run when each
    bucket was launched; ``backward share``, backward's median share of forward + backward
    (read on the timed steps, where only backward runs under the clock-reading mode: an
    overestimate); ``transfers``, (bytes, seconds) of every transfer span, to fit alpha and
    beta on (a span ends when gloo's thread runs its first callback, so it holds callback and
    GIL waits too); and ``waits``, seconds of every ``wait`` span: what a step waited after
    backward, the quantity the models predict."""
    fwd = {(s.rank, s.meta["step"]): s for s in spans if s.name == "forward"}
    bwd = {(s.rank, s.meta["step"]): s for s in spans if s.name == "backward"}
    queues = {}
    for s in spans:
        if s.name == "queue":
            b = bwd[(s.rank, s.meta["step"])]
            queues.setdefault(int(s.label[1:]), []).append(
                (s.meta["nbytes"], (s.start - b.start) / b.duration))
    order = sorted(queues)
    return {"nbytes": [queues[b][0][0] for b in order],
            "ready": [float(np.median([f for _, f in queues[b]])) for b in order],
            "backward share": float(np.median([bwd[k].duration / (fwd[k].duration + bwd[k].duration)
                                               for k in bwd])),
            "transfers": [(s.meta["nbytes"], s.duration) for s in spans if s.name == "transfer"],
            "waits": [s.duration for s in spans if s.name == "wait"]}


def predicted_exposed(profile, step_s, alpha, beta, world_size=2):
    """Exposed communication (seconds) three ways, for a step of ``step_s`` seconds without
    communication: ``"no overlap"`` (every all-reduce after backward); ``"equal buckets"``
    (``step_time.data_parallel_step``, lab 07's: equal buckets, backward 2/3 of the step);
    ``"this run's buckets"`` (``step_time.exposed_comm`` with the profile's bucket sizes,
    launch fractions and backward share)."""
    nbytes = profile["nbytes"]
    comm = [costmodel.allreduce_time(n, world_size, alpha, beta) for n in nbytes]
    backward = profile["backward share"] * step_s
    equal = step_time.data_parallel_step(step_s, sum(nbytes), world_size, (alpha, beta),
                                         overlap=1.0, num_buckets=len(nbytes))
    return {N_("no overlap"): sum(comm), N_("equal buckets"): equal.exposed_comm,
            N_("this run's buckets"): step_time.exposed_comm(
                [f * backward for f in profile["ready"]], comm, backward)}
