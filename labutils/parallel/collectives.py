"""Collectives from scratch: ring and recursive-doubling all-reduce, every collective drawn,
and all-reduce time against message size (algorithm and bus bandwidth).

Used by ``03a_parallelism_concepts`` (and its exercise ``check_ring_all_reduce``) and
``03c_challenges``; ``python -m labutils.bench collectives`` compares the two from-scratch
all-reduces with gloo's own ``dist.all_reduce``.

Both all-reduces behave like ``dist.all_reduce(tensor, group=group)``: in place, sum, any world
size, any tensor length (also shorter than, or not divisible by, the world size).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from labutils.core.launcher import launch
from labutils.core.rank import progress
from labutils.core.timing import Stats, slowest_rank

KiB, MiB = 2 ** 10, 2 ** 20


def _peer(group, group_rank):
    """Global rank of ``group_rank`` in ``group`` (send/recv address global ranks)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _exchange(send, dst, recv, src, group=None):
    """Send ``send`` to ``dst`` while receiving ``recv`` from ``src``.

    The send is non-blocking so that every rank can post its send and then block in recv
    without a cycle of blocking sends deadlocking the ring. Empty chunks are skipped on both
    sides (they happen when the tensor is shorter than the world size).
    """
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
        dist.send(flat, _peer(group, rank - pof2), group=group)
        dist.recv(flat, _peer(group, rank - pof2), group=group)
    else:
        incoming = torch.empty_like(flat)
        if rank < extra:
            dist.recv(incoming, _peer(group, rank + pof2), group=group)
            flat += incoming
        mask = 1
        while mask < pof2:
            _exchange(flat, rank ^ mask, incoming, rank ^ mask, group)
            flat += incoming  # a + b == b + a exactly, so every rank ends bit-identical
            mask <<= 1
        if rank < extra:
            dist.send(flat, _peer(group, rank + pof2), group=group)
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor


ALL_REDUCES = {"gloo": lambda t: dist.all_reduce(t), "ring": ring_all_reduce,
               "recursive_doubling": recursive_doubling_all_reduce}


# ---- every collective, before and after ----------------------------------------------------

COLLECTIVES = ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter", "scatter",
               "gather", "send_recv")


def _show_collective(name, rank, world_size, n):
    """Run one collective on small integer-valued tensors; return (before, after) on this rank."""
    x = torch.arange(n, dtype=torch.float32) + 10 * rank  # rank r holds r0, r1, r2, ...
    before = x.clone()
    if name == "broadcast":
        dist.broadcast(x, src=0)
        after = x
    elif name == "reduce":
        dist.reduce(x, dst=0)  # only rank 0's result is defined; gloo leaves the others alone
        after = x if rank == 0 else before
    elif name == "all_reduce":
        dist.all_reduce(x)
        after = x
    elif name == "all_gather":
        before = x[:1].clone()
        parts = [torch.empty(1) for _ in range(world_size)]
        dist.all_gather(parts, before)
        after = torch.cat(parts)
    elif name == "reduce_scatter":
        x = torch.arange(world_size, dtype=torch.float32) + 10 * rank
        before, after = x.clone(), torch.empty(1)
        dist.reduce_scatter(after, list(x.chunk(world_size)))
    elif name == "scatter":
        before = torch.arange(world_size, dtype=torch.float32) if rank == 0 else torch.empty(0)
        after = torch.empty(1)
        dist.scatter(after, list(before.chunk(world_size)) if rank == 0 else None, src=0)
    elif name == "gather":
        before = x[:1].clone()
        parts = [torch.empty(1) for _ in range(world_size)] if rank == 0 else None
        dist.gather(before, parts, dst=0)
        after = torch.cat(parts) if rank == 0 else torch.empty(0)
    elif name == "send_recv":  # a ring shift: everyone sends to the right, receives from the left
        after = torch.empty(n)
        _exchange(x, (rank + 1) % world_size, after, (rank - 1) % world_size)
    else:
        raise ValueError(f"unknown collective {name!r}; use one of {', '.join(COLLECTIVES)}")
    return before.tolist(), after.tolist()


def collectives_worker(rank, world_size, names=COLLECTIVES, n=3):
    """Every collective in ``names`` on this rank: {name: (before, after)}."""
    return {name: _show_collective(name, rank, world_size, n) for name in names}


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


# ---- measured cost -------------------------------------------------------------------------


def time_all_reduce_worker(rank, world_size, sizes, impls=("gloo",), repeats=5, warmup=1):
    """Time each all-reduce in ``impls`` at each size (bytes, fp32), interleaved.

    Each call is timed between barriers and a call's time is the slowest rank's (an
    all-reduce ends when the last rank has the result). Returns {impl: [seconds lists]}.
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
                ALL_REDUCES[impl](x)
                if i >= warmup:
                    times[impl].append(time.perf_counter() - t0)
        for impl in impls:
            out[impl].append(slowest_rank(times[impl]))
    return out


def measure_all_reduce(sizes, world_size=2, impls=("gloo", "ring", "recursive_doubling"),
                       repeats=5, warmup=1):
    """All-reduce time against message size on real ranks: {impl: [Stats per size]}."""
    bad = [i for i in impls if i not in ALL_REDUCES]
    if bad:
        raise ValueError(f"unknown all-reduce {bad}; use names from {list(ALL_REDUCES)}")
    if world_size < 2:
        raise ValueError(f"all-reduce time needs world_size >= 2; got {world_size}")
    if any(int(s) < 4 for s in sizes):
        raise ValueError(f"sizes are bytes of fp32 data, each >= 4; got {list(sizes)}")
    res = launch(time_all_reduce_worker, [int(s) for s in sizes], list(impls), repeats, warmup,
                 world_size=world_size, timeout=600)[0]
    return {impl: [Stats.of(v) for v in res[impl]] for impl in impls}
