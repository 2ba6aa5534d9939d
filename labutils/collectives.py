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
import warnings

import torch
import torch.distributed as dist

from .launcher import progress
from .timing import Stats

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


tree_all_reduce = recursive_doubling_all_reduce  # the latency-bound family's representative

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
    from .launcher import launch
    unknown = [x for x in names if x not in COLLECTIVES]
    if unknown:
        raise ValueError(f"unknown collective(s) {unknown}; use names from {COLLECTIVES}")
    if world_size < 2:
        raise ValueError(f"collectives need world_size >= 2 to show anything; got {world_size}")
    with warnings.catch_warnings():  # 4 tiny ranks on 2 cores are fine here: nothing is timed
        warnings.filterwarnings("ignore", message=r".* ranks on .* cores")
        per_rank = launch(collectives_worker, list(names), n, world_size=world_size)
    return {name: ([r[name][0] for r in per_rank], [r[name][1] for r in per_rank])
            for name in names}


def _draw_ranks(ax, values, title):
    import numpy as np
    width = max(1, max(len(v) for v in values))
    grid = np.full((len(values), width), np.nan)
    for r, v in enumerate(values):
        grid[r, :len(v)] = v
    ax.imshow(grid, cmap="viridis", vmin=0, vmax=np.nanmax(np.abs(grid)) if np.any(
        np.isfinite(grid)) else 1, aspect="auto")
    for r, v in enumerate(values):
        for i, val in enumerate(v):
            ax.text(i, r, f"{val:g}", ha="center", va="center", color="white", fontsize=8)
    ax.set_yticks(range(len(values)), [f"rank {r}" for r in range(len(values))], fontsize=7)
    ax.set_xticks([])
    ax.set_title(title, fontsize=9)


def plot_collectives(results, columns=2):
    """A grid: for each collective, every rank's tensor before (left) and after (right)."""
    import matplotlib.pyplot as plt
    names = list(results)
    rows = -(-len(names) // columns)
    fig, axes = plt.subplots(rows, 2 * columns, figsize=(3.2 * columns * 2, 1.7 * rows),
                             squeeze=False)
    for k, name in enumerate(names):
        r, c = divmod(k, columns)
        before, after = results[name]
        _draw_ranks(axes[r][2 * c], before, f"{name}: before")
        _draw_ranks(axes[r][2 * c + 1], after, f"{name}: after")
    for k in range(len(names), rows * columns):
        r, c = divmod(k, columns)
        axes[r][2 * c].axis("off"), axes[r][2 * c + 1].axis("off")
    fig.tight_layout()
    return fig


# ---- measured cost -------------------------------------------------------------------------

def algorithm_bandwidth(nbytes, seconds):
    """nccl-tests' algbw: the tensor's size over the time, bytes/s."""
    return nbytes / seconds


def bus_bandwidth(nbytes, seconds, world_size):
    """nccl-tests' busbw for all-reduce: algbw * 2 (p - 1) / p, comparable across world sizes
    because it is what each link carries under a bandwidth-optimal algorithm."""
    return algorithm_bandwidth(nbytes, seconds) * 2 * (world_size - 1) / world_size


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
            slowest = torch.tensor(times[impl], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            out[impl].append(slowest.tolist())
    return out


def measure_all_reduce(sizes, world_size=2, impls=("gloo", "ring", "recursive_doubling"),
                       repeats=5, warmup=1):
    """All-reduce time against message size on real ranks: {impl: [Stats per size]}."""
    from .launcher import launch
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


def plot_all_reduce_times(sizes, stats, world_size, fits=None, ax=None):
    """Time (median, min-max bars) against bytes on log axes; ``fits``: {label: seconds}."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    for impl, st in stats.items():
        med = [s.median for s in st]
        err = [[m - s.min for m, s in zip(med, st)], [s.max - m for m, s in zip(med, st)]]
        ax.errorbar(sizes, med, yerr=err, marker="o", capsize=3, label=f"{impl} (measured)")
    for label, secs in (fits or {}).items():
        ax.plot(sizes, secs, "--", label=label)
    ax.set_xscale("log", base=2), ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)"), ax.set_ylabel("all-reduce time (s)")
    ax.set_title(f"all-reduce on {world_size} ranks")
    ax.legend(fontsize=8)
    return ax


# ---- exercise: ring all-reduce --------------------------------------------------------------

def _rank_tensor(seed, rank, n, dtype):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype == "int64":
        return torch.randint(-100, 100, (n,), generator=g)
    return torch.randn(n, generator=g).to(getattr(torch, dtype))


def _ring_all_reduce_harness(rank, world_size, learner_fn, seed, n, dtype):
    # The reference is computed here, in one process, from every rank's rebuilt tensor.
    expected = sum(_rank_tensor(seed, r, n, dtype).double() for r in range(world_size))
    got = _rank_tensor(seed, rank, n, dtype)
    out = learner_fn(got)
    if out is not None and out is not got and out.data_ptr() != got.data_ptr():
        got = out  # accept a function that returns the result, as long as it is right
    return expected.to(got.dtype), got


def check_ring_all_reduce(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(tensor)``: afterwards every rank's ``tensor`` is the sum over ranks,
    for world sizes 2, 3 and 4 and lengths shorter than, equal to and not divisible by them."""
    from .exercises import make_cases, run_check
    cases = make_cases(world_sizes=(2, 3, 4), per_world_size=2, seed=3, n=[1, 5, 7, 10, 13],
                       dtype=["float32", "float64", "int64"])
    return run_check("ring_all_reduce", learner_fn, _ring_all_reduce_harness, cases,
                     timeout=timeout)


# ---- benchmark: python -m labutils.bench collectives -----------------------------------------

def bench_collectives(quick=False):
    """Ring and recursive doubling (from scratch) vs gloo's all-reduce: bus bandwidth at
    1 KiB, 1 MiB and 64 MiB on 2 ranks, and each from-scratch time over gloo's, side by side."""
    from .bench import Row
    sizes = [KiB, MiB] if quick else [KiB, MiB, 64 * MiB]
    world_size = 2
    stats = measure_all_reduce(sizes, world_size, repeats=2 if quick else 7)
    rows = []
    for k, nbytes in enumerate(sizes):
        label = f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"
        for impl, st in stats.items():
            s = st[k]
            bw = Stats(*(bus_bandwidth(nbytes, t, world_size) / 1e9
                         for t in (s.median, s.max, s.min)))
            rows.append(Row("collectives", f"{impl} all-reduce busbw, {label}", bw, "GB/s",
                            f"median time {s.median * 1e3:.3g} ms"))
        for impl in ("ring", "recursive_doubling"):
            rows.append(Row("collectives", f"{impl} / gloo time, {label}",
                            stats[impl][k] / stats["gloo"][k], "ratio"))
    return rows
