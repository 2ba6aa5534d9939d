"""Every collective on real ranks, before and after: what lab 03a1 draws
(``labutils.viz.figures.plot_collectives``; ``experiments.collective_runs.run_collectives``
launches it). Rank ``r`` starts with ``10r, 10r+1, ...``, so each
result can be checked by eye and by the formulas the notebook asserts. "After" is what the rank
really holds when the call returns, also where the API defines nothing (``reduce``'s other
ranks) or leaves the tensor alone (``gather``'s other ranks): the notebook compares it with
"before" rather than assuming.

Eight calls of ``torch.distributed`` (gloo, CPU), plus one ring shift built from send/recv.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from labutils.parallel.collectives import _exchange

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
        dist.reduce(x, dst=0)  # only rank 0's result is defined: the others may serve as scratch
        after = x              # every rank's own tensor as the call left it, root or not
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
        dist.gather(x[:1], parts, dst=0)   # the tensor itself, not a copy: watched below
        # what each rank holds afterwards: rank 0 the gathered pieces, the others the very
        # tensor they sent, as the call left it (the notebook asserts it was left alone)
        after = torch.cat(parts) if rank == 0 else x[:1]
    elif name == "send_recv":  # a ring shift: everyone sends to the right, receives from the left
        after = torch.empty(n)
        _exchange(x, (rank + 1) % world_size, after, (rank - 1) % world_size)
    else:
        raise ValueError(f"unknown collective {name!r}; use one of {', '.join(COLLECTIVES)}")
    return before.tolist(), after.tolist()


def collectives_worker(rank, world_size, names=COLLECTIVES, n=3):
    """Every collective in ``names`` on this rank: {name: (before, after)}."""
    return {name: _show_collective(name, rank, world_size, n) for name in names}

