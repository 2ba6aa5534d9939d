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
Every tensor is ready before the first call here, so nothing overlaps with a backward pass: these
timings compare call counts only (04a shows overlap on a timeline, 04c measures it).

``measure_call_cost`` takes one call's cost apart in the same processes and times gloo's
``dist.all_reduce`` at several sizes, to fit 03a2's model (alpha, beta) to it. ``allreduce_scaled`` and
``measure_underflow`` show what fp16 costs small gradients (underflow) and what scaling them by a
power of two before the cast wins back.
"""
from __future__ import annotations

import contextlib
import math
import time
import uuid

import torch
import torch.distributed as dist

from labutils.core.commcount import count_collectives
from labutils.core.launcher import launch
from labutils.core.rank import progress
from labutils.core.timing import Stats, slowest_rank
from labutils.cost.costmodel import fit, get_link
from labutils.parallel.emulation import emulate
from labutils.parallel.flat_mlp import batch_indices, loss_and_grad

KiB, MiB = 2 ** 10, 2 ** 20
CONTROL = "per tensor, smallest size each"   # the same calls on tensors of the sweep's first size


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


def time_sync_worker(rank, world_size, shapes, bucket_sizes, repeats=7, warmup=2, link=None):
    """Time every variant on zero tensors of ``shapes``, interleaved; slowest rank's times.
    Returns {label: (seconds list, all-reduce calls counted as issued, bytes sent per rank in
    all-reduce input)}. ``link`` (a name of ``costmodel.LINKS``): the timed rounds run on that
    emulated link (``emulation.emulate``: the real all-reduce, then a wait to the link's
    modelled time), where the time per byte can dominate as it does between machines."""
    tensors = [torch.zeros(s) for s in shapes]
    variants = _variants(bucket_sizes)
    calls = {}
    for label, fn in variants.items():  # an untimed pass that counts the calls each one issues
        with count_collectives() as counted:
            fn(tensors)
        calls[label] = counted.all_reduces
    with emulate(link) if link is not None else contextlib.nullcontext():
        times = _interleaved_rounds({k: (lambda fn=fn: fn(tensors)) for k, fn in variants.items()},
                                    repeats, warmup)
    numel = sum(t.numel() for t in tensors)
    out = {}
    for label in variants:
        nbytes = numel * (2 if ("fp16" in label or "bf16" in label) else 4)
        out[label] = (times[label], calls[label], nbytes)
    return out


def _interleaved_rounds(variants, repeats, warmup):
    """Inside the ranks: each round runs every variant once after a barrier (so noise from other
    jobs hits them alike); the slowest rank's seconds, {label: [one per round]}."""
    times = {k: [] for k in variants}
    for i in range(warmup + repeats):
        progress(i + 1, warmup + repeats, "repeats")  # rank 0 drives a panel's bar
        for label, fn in variants.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            if i >= warmup:
                times[label].append(time.perf_counter() - t0)
    return {k: slowest_rank(v) for k, v in times.items()}


def measure_gradient_sync(model, world_size=2, bucket_sizes=(16 * 1024, 256 * 1024),
                          repeats=7, link=None):
    """Per-variant ``(Stats, all-reduce calls, bytes)`` for syncing ``model``'s gradients; the
    Stats of one call are paired (one ``rounds``): ``lu.timing.compare`` takes per-round ratios.
    ``link``: time on that emulated link (``time_sync_worker``)."""
    if world_size < 2:
        raise ValueError(f"gradient sync needs world_size >= 2; got {world_size}")
    if any(int(b) < 1 for b in bucket_sizes):
        raise ValueError(f"bucket sizes are bytes, each >= 1; got {list(bucket_sizes)}")
    if link is not None:
        get_link(link)          # an unknown link is named before any rank starts
    shapes = [tuple(p.shape) for p in model.parameters()]
    res = launch(time_sync_worker, shapes, [int(b) for b in bucket_sizes], repeats, link=link,
                 world_size=world_size, timeout=300, warn_oversubscription=False)[0]
    rounds = uuid.uuid4().hex
    return {k: (Stats.of(v[0], rounds), v[1], v[2]) for k, v in res.items()}


# ---- what one call costs, taken apart ------------------------------------------------------

def time_call_cost_worker(rank, world_size, shapes, sizes, repeats=7, warmup=2, calls=5):
    """In the same processes: interleaved rounds of the per-tensor sync of ``shapes``, the same
    number of calls on tensors of the sweep's smallest size (the fixed-cost control: a size the
    fit covers; a 1-element tensor, fewer elements than ranks, may take another path in gloo
    and cost less than the fit's alpha), the flat buffer, and one all-reduce of a flat buffer
    that is already there (the flat buffer without its copies); then back-to-back calls of
    gloo's ``dist.all_reduce`` at each of ``sizes``, in the same rounds, so that a round's fit
    pairs with that round's calls. Returns {label: [seconds per round]} and "sweep": [seconds
    per call and round, one list per size]."""
    grads = [torch.zeros(s) for s in shapes]
    small = [torch.zeros(max(1, sizes[0] // 4)) for _ in shapes]
    ready = torch.zeros(sum(t.numel() for t in grads))
    sweep = {n: torch.zeros(max(1, n // 4)) for n in sizes}

    def back_to_back(t):
        for _ in range(calls):
            dist.all_reduce(t)
    out = _interleaved_rounds({
        "per tensor": lambda: allreduce_per_tensor(grads),
        CONTROL: lambda: allreduce_per_tensor(small),
        "flat buffer": lambda: allreduce_flat(grads),
        "one ready flat buffer": lambda: dist.all_reduce(ready),
        **{("sweep", n): (lambda t=t: back_to_back(t)) for n, t in sweep.items()},
    }, repeats, warmup)
    out["sweep"] = [[s / calls for s in out.pop(("sweep", n))] for n in sizes]
    return out


def measure_call_cost(model, world_size=2, sizes=(KiB, 16 * KiB, 256 * KiB, MiB), repeats=7):
    """One launch: ``time_call_cost_worker`` on ``model``'s gradient shapes, then alpha and beta
    fitted to the sweep with lab 03a2's model (gloo as a ring: ``costmodel.fit``), once per
    round. Returns dict(stats={label: Stats, paired}, sweep=[Stats per size], alpha=Stats,
    beta=Stats (one fit per round: paired with ``stats``), sizes, shapes, world_size)."""
    if world_size < 2:
        raise ValueError(f"an all-reduce call needs world_size >= 2; got {world_size}")
    shapes = [tuple(p.shape) for p in model.parameters()]
    res = launch(time_call_cost_worker, shapes, [int(s) for s in sizes], repeats,
                 world_size=world_size, timeout=300, warn_oversubscription=False)[0]
    sweep = res.pop("sweep")
    rounds = uuid.uuid4().hex
    fits = [fit(sizes, [per_size[i] for per_size in sweep], world_size, algorithm="ring")
            for i in range(len(sweep[0]))]
    alphas, betas = zip(*fits)
    return dict(stats={k: Stats.of(v, rounds) for k, v in res.items()},
                sweep=[Stats.of(v, rounds) for v in sweep], alpha=Stats.of(alphas, rounds),
                beta=Stats.of(betas, rounds), sizes=list(sizes), shapes=shapes,
                world_size=world_size)


# ---- what fp16 costs small gradients --------------------------------------------------------

def gradient_scale(grad, world_size, dtype=torch.float16):
    """The largest power of two by which every rank may multiply its gradient so that the sum
    over ``world_size`` ranks still fits ``dtype`` (where a dynamic loss scaler settles)."""
    peak = grad.abs().max().reshape(1)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)  # the same scale on every rank
    return 2.0 ** math.floor(math.log2(torch.finfo(dtype).max / (world_size * float(peak))))


def allreduce_scaled(grad, scale=1.0, dtype=torch.float16):
    """Sum ``grad`` over the ranks sent in ``dtype``, multiplied by ``scale`` on the wire and
    divided after. A power of two changes no significant bit (in fp32, exact), but it lifts
    small values above fp16's smallest normal number (2^-14) and keeps those below 2^-25 from
    rounding to zero. Loss scaling does this by scaling the loss, so backward's gradients are
    already scaled. Returns (what travelled, the sum in fp32)."""
    wire = (grad * scale).to(dtype)
    dist.all_reduce(wire)
    return wire, wire.float() / scale


def underflow_worker(rank, world_size, params, X, y, cfg, step):
    """Every rank: its gradient at ``params`` on its batch of ``step``, summed in fp32 (the
    reference), then in fp16, fp16 scaled by ``gradient_scale``, and bf16. Per variant, counted
    on every rank's wire and summed over the ranks: the elements, nonzero in fp32, that the
    cast made 0 ("flushed") or subnormal ("subnormal": fewer significant bits); and counted on
    the sum, the elements that differ from the fp32 sum by more than rounding to the dtype's
    significant bits allows ("off")."""
    idx = batch_indices(cfg, rank, step, len(X))
    _, grad = loss_and_grad(params, X[idx], y[idx], cfg.hidden)
    exact, mag = grad.clone(), grad.abs()
    dist.all_reduce(exact)
    dist.all_reduce(mag)                    # sum over ranks of |gradient|: the rounding bound
    nonzero = grad != 0
    out = {"elements": grad.numel()}
    counts = [int(nonzero.sum())]
    for label, dtype, scale in (("float16", torch.float16, 1.0),
                                ("float16, scaled", torch.float16,
                                 gradient_scale(grad, world_size)),
                                ("bfloat16", torch.bfloat16, 1.0)):
        sent = (grad * scale).to(dtype)     # what this rank puts on the wire
        info = torch.finfo(dtype)
        _, back = allreduce_scaled(grad, scale, dtype)
        # rounding to nearest: each rank's cast and each of the p-1 partial sums add at most
        # eps/2 of the sum of the magnitudes, so p * eps/2 * mag bounds a normal-range sum
        bound = world_size * info.eps / 2 * mag
        out[label] = dict(scale=scale, off=int(((back - exact).abs() > bound).sum()))
        counts += [int(((sent == 0) & nonzero).sum()),
                   int(((sent != 0) & (sent.abs() < info.tiny)).sum())]
    counts = torch.tensor(counts)
    dist.all_reduce(counts)                 # every rank's wire, counted (exact: int64)
    out["nonzero"] = int(counts[0])
    for k, label in enumerate(("float16", "float16, scaled", "bfloat16")):
        out[label].update(flushed=int(counts[1 + 2 * k]), subnormal=int(counts[2 + 2 * k]))
    return out


def measure_underflow(params, X, y, cfg, step, world_size=2):
    """``underflow_worker`` on real ranks: the counts (every rank returns the same)."""
    return launch(underflow_worker, params, X, y, cfg, int(step), world_size=world_size,
                  timeout=120, warn_oversubscription=False)[0]
