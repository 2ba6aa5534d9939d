"""Collectives from scratch: ring, recursive-doubling and root-based all-reduce, their counted
messages and bytes, and all-reduce time against message size (every collective drawn is in
``collective_demo``).

Used by ``03a_parallelism_concepts`` (and its exercise ``check_ring_all_reduce``) and
``03e_consistency_and_hardware`` (a distributed sum's order); ``python -m labutils.bench
collectives`` compares the two from-scratch all-reduces with gloo's own ``dist.all_reduce``.

Both all-reduces behave like ``dist.all_reduce(tensor, group=group)``: in place, sum, any world
size, any tensor length (also shorter than, or not divisible by, the world size). A third,
``root_all_reduce`` (reduce onto rank 0, then broadcast), is the contrast for the ring's
bandwidth optimality; ``trace_all_reduce`` counts the messages and bytes each one sends.
"""
from __future__ import annotations

import contextlib
import time
from collections import Counter

import torch
import torch.distributed as dist

from labutils.core.launcher import launch
from labutils.core.rank import progress
from labutils.core.timing import Stats, slowest_rank

KiB, MiB = 2 ** 10, 2 ** 20


def _peer(group, group_rank):
    """Global rank of ``group_rank`` in ``group`` (send/recv address global ranks)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


_TRACE = None  # a list while ``_traced`` is on: one (dst, bytes) record per message step


@contextlib.contextmanager
def _traced():
    """Record every message step this rank takes (counted where it is sent, not computed)."""
    global _TRACE
    _TRACE = []
    try:
        yield _TRACE
    finally:
        _TRACE = None


def _record(dst=None, send=None):
    """One blocking message step on this rank; ``(dst, bytes)`` when it sends."""
    if _TRACE is not None:
        _TRACE.append((dst, send.numel() * send.element_size()) if send is not None
                      and send.numel() else (None, 0))


def _send(tensor, dst, group=None):
    _record(dst, tensor)
    dist.send(tensor, _peer(group, dst), group=group)


def _recv(tensor, src, group=None):
    _record()
    dist.recv(tensor, _peer(group, src), group=group)


def _exchange(send, dst, recv, src, group=None):
    """Send ``send`` to ``dst`` while receiving ``recv`` from ``src``: one message step.

    The send is non-blocking so that every rank can post its send and then block in recv
    without a cycle of blocking sends deadlocking the ring. Empty chunks are skipped on both
    sides (they happen when the tensor is shorter than the world size).
    """
    _record(dst, send)
    req = dist.isend(send, _peer(group, dst), group=group) if send.numel() else None
    if recv.numel():
        dist.recv(recv, _peer(group, src), group=group)
    if req is not None:
        req.wait()


def ring_all_reduce(tensor, group=None):
    """Sum ``tensor`` over the ranks of ``group``, in place: reduce-scatter, then all-gather.

    Patarasuk and Yuan (2009): each rank sends and receives 2 (p-1)/p of the tensor in
    2 (p-1) steps, whatever p is, so it is bandwidth-optimal but pays 2 (p-1) latencies.
    """
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    if world_size == 1 or tensor.numel() == 0:
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()
    chunks = list(flat.tensor_split(world_size))  # p views; sizes differ by at most one
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    incoming = torch.empty_like(chunks[0])
    # Phase 1, reduce-scatter: at step s rank r passes its partial sum of chunk (r - s) to
    # the right and adds the left neighbour's partial sum of chunk (r - s - 1) to its own.
    # After p - 1 steps rank r holds the complete sum of chunk (r + 1) % p.
    for step in range(world_size - 1):
        send_chunk = chunks[(rank - step) % world_size]
        recv_chunk = chunks[(rank - step - 1) % world_size]
        buf = incoming[:recv_chunk.numel()]
        _exchange(send_chunk, right, buf, left, group)
        recv_chunk += buf
    # Phase 2, all-gather: pass each complete chunk once more around the ring, overwriting.
    for step in range(world_size - 1):
        send_chunk = chunks[(rank + 1 - step) % world_size]
        recv_chunk = chunks[(rank - step) % world_size]
        _exchange(send_chunk, right, recv_chunk, left, group)
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def recursive_doubling_all_reduce(tensor, group=None):
    """Sum ``tensor`` over the ranks of ``group``, in place, by recursive doubling.

    Thakur, Rabenseifner and Gropp (2005): in round k rank r swaps its whole tensor with rank
    r XOR 2^k and adds, so log2 p rounds suffice (latency-optimal) but every round sends the
    whole tensor (log2 p times the bytes of the ring's chunks). A world size that is not a
    power of two first folds its extra ranks into partners and hands them the result at the end.
    """
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    if world_size == 1 or tensor.numel() == 0:
        return tensor
    flat = tensor.reshape(-1).clone() if not tensor.is_contiguous() else tensor.view(-1)
    pof2 = 1 << (world_size.bit_length() - 1)  # largest power of two <= world_size
    extra = world_size - pof2
    if rank >= pof2:  # an extra rank: its partner rank - pof2 reduces on its behalf
        _send(flat, rank - pof2, group)
        _recv(flat, rank - pof2, group)
    else:
        incoming = torch.empty_like(flat)
        if rank < extra:
            _recv(incoming, rank + pof2, group)
            flat += incoming
        mask = 1
        while mask < pof2:
            _exchange(flat, rank ^ mask, incoming, rank ^ mask, group)
            flat += incoming  # a + b == b + a exactly, so every rank ends bit-identical
            mask <<= 1
        if rank < extra:
            _send(flat, rank + pof2, group)
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def root_all_reduce(tensor, group=None):
    """Sum ``tensor`` over the ranks of ``group``, in place, through rank 0: every rank sends
    its whole tensor to rank 0, which sums and sends the result back (reduce, then broadcast).
    The contrast to the ring: rank 0's link carries (p-1) whole tensors each way."""
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    if world_size == 1 or tensor.numel() == 0:
        return tensor
    flat = tensor.reshape(-1).clone() if not tensor.is_contiguous() else tensor.view(-1)
    if rank == 0:
        incoming = torch.empty_like(flat)
        for src in range(1, world_size):
            _recv(incoming, src, group)
            flat += incoming
        for dst in range(1, world_size):
            _send(flat, dst, group)
    else:
        _send(flat, 0, group)
        _recv(flat, 0, group)
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor


ALL_REDUCES = {"gloo": lambda t: dist.all_reduce(t), "ring": ring_all_reduce,
               "recursive_doubling": recursive_doubling_all_reduce, "root": root_all_reduce}


def _trace_worker(rank, world_size, names, numel):
    out = {}
    for name in names:
        x = torch.ones(numel)
        with _traced() as trace:
            ALL_REDUCES[name](x)
        assert torch.all(x == world_size), f"{name} did not sum"
        out[name] = trace
    return out


def trace_all_reduce(world_size, numel, names=("ring", "recursive_doubling", "root")):
    """Run each from-scratch all-reduce once on ``world_size`` ranks, counting what it sends.

    Returns {name: {"steps": [message steps per rank], "sent": [bytes sent per rank],
    "received": [bytes received per rank], "link": Counter {(src, dst): bytes}}}. A message step is one blocking send, recv or
    send-while-receiving on one rank; the latency an algorithm pays is its largest count.
    """
    bad = [x for x in names if x not in ALL_REDUCES or x == "gloo"]
    if bad:
        raise ValueError(f"can only trace the from-scratch all-reduces; got {bad}")
    # nothing is timed: oversubscribed ranks only count here
    per_rank = launch(_trace_worker, list(names), int(numel), world_size=world_size,
                      warn_oversubscription=False)
    out = {}
    for name in names:
        link = Counter()
        for src, trace in enumerate(r[name] for r in per_rank):
            for dst, nbytes in trace:
                if dst is not None:
                    link[(src, dst)] += nbytes
        out[name] = dict(steps=[len(r[name]) for r in per_rank],
                         sent=[sum(b for _, b in r[name]) for r in per_rank],
                         received=[sum(b for (_, d), b in link.items() if d == dst)
                                   for dst in range(world_size)], link=link)
    return out


# ---- measured cost -------------------------------------------------------------------------


def time_all_reduce_worker(rank, world_size, sizes, impls=("gloo",), repeats=5, warmup=1,
                           calls=1):
    """Time each all-reduce in ``impls`` at each size (bytes, fp32), interleaved.

    A sample is ``calls`` back-to-back calls after a barrier, divided by ``calls`` (with one
    call a sample mostly measures which rank left the barrier last, as nccl-tests knows), and
    its time is the slowest rank's (an all-reduce ends when the last rank has the result).
    Returns {impl: [seconds lists]}.
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
    """All-reduce time against message size on real ranks: {impl: [Stats per size]}."""
    bad = [i for i in impls if i not in ALL_REDUCES]
    if bad:
        raise ValueError(f"unknown all-reduce {bad}; use names from {list(ALL_REDUCES)}")
    if world_size < 2:
        raise ValueError(f"all-reduce time needs world_size >= 2; got {world_size}")
    if any(int(s) < 4 for s in sizes):
        raise ValueError(f"sizes are bytes of fp32 data, each >= 4; got {list(sizes)}")
    res = launch(time_all_reduce_worker, [int(s) for s in sizes], list(impls), repeats, warmup,
                 int(calls), world_size=world_size, timeout=600)[0]
    return {impl: [Stats.of(v) for v in res[impl]] for impl in impls}
