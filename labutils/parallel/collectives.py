"""Collectives from scratch: ring, recursive-doubling and root-based all-reduce (every collective
drawn is in ``collective_demo``).

Used by ``03a1_collectives_and_ring`` (and its exercise ``check_ring_all_reduce``) and
``03e1_data_inconsistency`` (a distributed sum's order). What they send is counted from
outside, at the dispatcher, and their time measured there too: ``experiments/collective_runs``;
``python -m labutils.bench collectives`` compares them with gloo's own ``dist.all_reduce``.

All three behave like ``dist.all_reduce(tensor, group=group)``: in place, sum, any world size,
any tensor length (also shorter than, or not divisible by, the world size). The third,
``root_all_reduce`` (reduce onto rank 0, then broadcast), is the contrast for the ring's
bandwidth optimality. The fourth, ``halving_doubling_all_reduce`` (Rabenseifner's, used by
``03a2_collective_cost``), has the ring's bytes in log-many steps.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist


def _peer(group, group_rank):
    """Global rank of ``group_rank`` in ``group`` (send/recv address global ranks)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _send(tensor, dst, group=None):
    dist.send(tensor, _peer(group, dst), group=group)


def _recv(tensor, src, group=None):
    dist.recv(tensor, _peer(group, src), group=group)


def _exchange(send, dst, recv, src, group=None):
    """Send ``send`` to ``dst`` while receiving ``recv`` from ``src``: one message step.

    The send is non-blocking so that every rank can post its send and then block in recv
    without a cycle of blocking sends deadlocking the ring. Empty chunks are skipped on both
    sides (they happen when the tensor is shorter than the world size).
    """
    req = dist.isend(send, _peer(group, dst), group=group) if send.numel() else None
    if recv.numel():
        dist.recv(recv, _peer(group, src), group=group)
    if req is not None:
        req.wait()


def _flat_in_place(algorithm):
    """Let ``algorithm(flat, group)``, written for a 1-D tensor, reduce any tensor in place like
    ``dist.all_reduce``: a flat view (a flat copy when the tensor is not contiguous, copied
    back), and nothing to do on one rank or an empty tensor."""
    @functools.wraps(algorithm)
    def all_reduce(tensor, group=None):
        if dist.get_world_size(group) == 1 or tensor.numel() == 0:
            return tensor
        flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()
        algorithm(flat, group)
        if flat.data_ptr() != tensor.data_ptr():
            tensor.copy_(flat.view_as(tensor))
        return tensor
    return all_reduce


@_flat_in_place
def ring_all_reduce(flat, group=None):
    """Sum ``flat`` over the ranks of ``group``, in place: reduce-scatter, then all-gather.

    Patarasuk and Yuan (2009): each rank sends and receives 2 (p-1)/p of the tensor in
    2 (p-1) steps, whatever p is: bandwidth-optimal, but it pays 2 (p-1) latencies.
    """
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    chunks = flat.tensor_split(world_size)  # p views; sizes differ by at most one
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    incoming = torch.empty_like(chunks[0])  # chunk 0 is the largest
    # Reduce-scatter: at step s rank r passes its partial sum of chunk (r - s) to the right
    # and adds the left neighbour's partial sum of chunk (r - s - 1) to its own.
    # After p - 1 steps rank r holds the complete sum of chunk (r + 1) % p.
    for step in range(world_size - 1):
        mine = chunks[(rank - step - 1) % world_size]
        _exchange(chunks[(rank - step) % world_size], right, incoming[:mine.numel()], left, group)
        mine += incoming[:mine.numel()]
    # All-gather: pass each complete chunk once more around the ring, overwriting.
    for step in range(world_size - 1):
        _exchange(chunks[(rank + 1 - step) % world_size], right,
                  chunks[(rank - step) % world_size], left, group)


@_flat_in_place
def recursive_doubling_all_reduce(flat, group=None):
    """Sum ``flat`` over the ranks of ``group``, in place, by recursive doubling.

    Thakur, Rabenseifner and Gropp (2005): in round k rank r swaps its whole tensor with rank
    r XOR 2^k and adds, so log2 p rounds suffice (latency-optimal) but every round sends the
    whole tensor (log2 p times the bytes of the ring's chunks). A world size that is not a
    power of two first folds its extra ranks into partners and hands them the result at the end.
    """
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    pof2 = 1 << (world_size.bit_length() - 1)  # largest power of two <= world_size
    extra = world_size - pof2
    if rank >= pof2:  # an extra rank: its partner rank - pof2 reduces on its behalf
        _send(flat, rank - pof2, group)
        _recv(flat, rank - pof2, group)
        return
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


@_flat_in_place
def root_all_reduce(flat, group=None):
    """Sum ``flat`` over the ranks of ``group``, in place, through rank 0: every rank sends
    its whole tensor to rank 0, which sums and sends the result back (reduce, then broadcast).
    The contrast to the ring: rank 0's link carries (p-1) whole tensors each way."""
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    if rank != 0:
        _send(flat, 0, group)
        _recv(flat, 0, group)
        return
    incoming = torch.empty_like(flat)
    for src in range(1, world_size):
        _recv(incoming, src, group)
        flat += incoming
    for dst in range(1, world_size):
        _send(flat, dst, group)


@_flat_in_place
def halving_doubling_all_reduce(flat, group=None):
    """Sum ``flat`` over the ranks of ``group``, in place: Rabenseifner's algorithm.

    Thakur, Rabenseifner and Gropp (2005): a reduce-scatter by recursive halving (swap half of
    the range you are responsible for with rank r XOR 2^k, keep and sum the other half), then an
    all-gather by recursive doubling (the same swaps in reverse, whole ranges this time). The
    ring's 2 (p-1)/p of the tensor, but in 2 log2 p steps. Extra ranks (p not a power of two)
    fold into partners first, as in ``recursive_doubling_all_reduce``.
    """
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    pof2 = 1 << (world_size.bit_length() - 1)
    extra = world_size - pof2
    if rank >= pof2:
        _send(flat, rank - pof2, group)
        _recv(flat, rank - pof2, group)
        return
    if rank < extra:
        incoming = torch.empty_like(flat)
        _recv(incoming, rank + pof2, group)
        flat += incoming
    # chunk c ends fully summed on rank c; a range of chunks [lo, hi) is one slice of flat
    edges = [0]
    for chunk in flat.tensor_split(pof2):
        edges.append(edges[-1] + chunk.numel())
    span = lambda lo, hi: flat[edges[lo]:edges[hi]]
    incoming = torch.empty(edges[pof2 // 2] if pof2 > 1 else 0, dtype=flat.dtype)
    lo, hi, ranges = 0, pof2, []
    mask = pof2 // 2
    while mask:  # reduce-scatter: halve the range each step
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if rank & mask == 0 else ((mid, hi), (lo, mid))
        mine = span(*keep)
        _exchange(span(*give), rank ^ mask, incoming[:mine.numel()], rank ^ mask, group)
        mine += incoming[:mine.numel()]
        ranges.append(((lo, hi), keep))
        (lo, hi), mask = keep, mask >> 1
    mask = 1
    for (whole, keep) in reversed(ranges):  # all-gather: double the range each step
        other = (whole[0], keep[0]) if keep[0] > whole[0] else (keep[1], whole[1])
        _exchange(span(*keep), rank ^ mask, span(*other), rank ^ mask, group)
        mask <<= 1
    if rank < extra:
        _send(flat, rank + pof2, group)


ALL_REDUCES = {"gloo": lambda t: dist.all_reduce(t), "ring": ring_all_reduce,
               "recursive_doubling": recursive_doubling_all_reduce, "root": root_all_reduce,
               "halving_doubling": halving_doubling_all_reduce}
