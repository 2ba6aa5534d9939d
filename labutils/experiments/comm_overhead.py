"""Communication overhead of gradient synchronisation: many small all-reduces vs one flat
buffer vs buckets, and compression to fp16/bf16.

Used by ``03d_communication_challenges``. Each function sums a list of gradient tensors over
the ranks, in place, exactly like one ``dist.all_reduce`` per tensor; they differ only in how
many calls they make (gloo pays a fixed latency per call) and how many bytes they send.

``make_buckets`` is not DDP's bucketer: it fills buckets to *at least* ``bucket_bytes`` in
registration order (here every tensor is ready at once, so only the count of calls matters),
while ``lu.ddp.assign_buckets`` caps buckets at ``bucket_cap_mb`` in reverse order and splits
on dtype, so that buckets fill in the order backward produces gradients (as PyTorch's DDP does,
though PyTorch closes a bucket once it has reached the cap rather than before: 04a shows both).
"""
from __future__ import annotations

import time
import uuid

import torch
import torch.distributed as dist

from labutils.core.commcount import count_collectives
from labutils.core.launcher import launch
from labutils.core.rank import progress
from labutils.core.timing import Stats, slowest_rank


def allreduce_per_tensor(tensors):
    """One all-reduce per tensor: one latency per tensor."""
    for t in tensors:
        dist.all_reduce(t)
    return 1 * len(tensors)


def allreduce_flat(tensors):
    """Copy every tensor into one flat buffer, one all-reduce, copy back: one latency."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t))
    return 1


def make_buckets(tensors, bucket_bytes):
    """Group consecutive tensors into buckets of at least ``bucket_bytes`` (the last may be
    smaller); a tensor larger than a bucket gets one of its own. Lists of indices."""
    buckets, current, size = [], [], 0
    for i, t in enumerate(tensors):
        current.append(i)
        size += t.numel() * t.element_size()
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def allreduce_buckets(tensors, bucket_bytes):
    """One flat all-reduce per bucket: few latencies, and (in DDP) the first buckets can be
    sent while backward still computes the rest."""
    buckets = make_buckets(tensors, bucket_bytes)
    for bucket in buckets:
        allreduce_flat([tensors[i] for i in bucket])
    return len(buckets)


def allreduce_compressed(tensors, dtype=torch.float16):
    """The flat buffer sent in ``dtype`` (half the bytes of fp32), summed, cast back."""
    flat = torch.cat([t.reshape(-1) for t in tensors]).to(dtype)
    dist.all_reduce(flat)
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t))
    return 1



def _variants(bucket_sizes):
    v = {"per tensor": allreduce_per_tensor, "flat buffer": allreduce_flat}
    for b in bucket_sizes:
        v[f"buckets of {b // 1024} KiB"] = lambda ts, b=b: allreduce_buckets(ts, b)
    v["flat fp16"] = lambda ts: allreduce_compressed(ts, torch.float16)
    v["flat bf16"] = lambda ts: allreduce_compressed(ts, torch.bfloat16)
    return v


def time_sync_worker(rank, world_size, shapes, bucket_sizes, repeats=7, warmup=2):
    """Time every variant on zero tensors of ``shapes``, interleaved; slowest rank's times.
    Returns {label: (seconds list, all-reduce calls counted as issued, bytes sent per rank in
    all-reduce input)}."""
    tensors = [torch.zeros(s) for s in shapes]
    variants = _variants(bucket_sizes)
    times = {k: [] for k in variants}
    calls = {}
    for label, fn in variants.items():  # an untimed pass that counts the calls each one issues
        with count_collectives() as counted:
            fn(tensors)
        calls[label] = counted.all_reduces
    for i in range(warmup + repeats):
        progress(i + 1, warmup + repeats, "repeats")  # rank 0 drives a panel's bar
        for label, fn in variants.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn(tensors)
            if i >= warmup:
                times[label].append(time.perf_counter() - t0)
    numel = sum(t.numel() for t in tensors)
    out = {}
    for label in variants:
        nbytes = numel * (2 if ("fp16" in label or "bf16" in label) else 4)
        out[label] = (slowest_rank(times[label]), calls[label], nbytes)
    return out


def measure_gradient_sync(model, world_size=2, bucket_sizes=(16 * 1024, 256 * 1024),
                          repeats=7):
    """Per-variant ``(Stats, all-reduce calls, bytes)`` for syncing ``model``'s gradients; the
    Stats of one call are paired (one ``rounds``): ``lu.timing.compare`` takes per-round ratios."""
    if world_size < 2:
        raise ValueError(f"gradient sync needs world_size >= 2; got {world_size}")
    if any(int(b) < 1 for b in bucket_sizes):
        raise ValueError(f"bucket sizes are bytes, each >= 1; got {list(bucket_sizes)}")
    shapes = [tuple(p.shape) for p in model.parameters()]
    res = launch(time_sync_worker, shapes, [int(b) for b in bucket_sizes], repeats,
                 world_size=world_size, timeout=300, warn_oversubscription=False)[0]
    rounds = uuid.uuid4().hex
    return {k: (Stats.of(v[0], rounds), v[1], v[2]) for k, v in res.items()}
