"""Splitting one matmul over ranks (05, the idea behind tensor parallelism): by columns of the
weight (each rank a slice of the output, then all-gather) or by rows (each rank a partial sum,
then all-reduce)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from labutils.core.launcher import launch


def column_parallel_matmul(rank, world_size, x, w):
    """x @ w with w split by columns: each rank makes its columns of y, all-gather joins them."""
    w_local = w.chunk(world_size, dim=1)[rank]          # (k, n / world_size)
    y_local = x @ w_local                               # (b, n / world_size)
    parts = [torch.empty_like(y_local) for _ in range(world_size)]
    dist.all_gather(parts, y_local)
    return torch.cat(parts, dim=1)                      # (b, n)


def row_parallel_matmul(rank, world_size, x, w):
    """x @ w with w split by rows (and x by columns): partial sums, all-reduce adds them."""
    x_local = x.chunk(world_size, dim=1)[rank]          # (b, k / world_size)
    w_local = w.chunk(world_size, dim=0)[rank]          # (k / world_size, n)
    y = x_local @ w_local                               # (b, n), one share of the sum
    dist.all_reduce(y)
    return y


def run_split_matmul(x, w, world_size=2, how="column"):
    """Check shapes, then run one split matmul on real ranks; returns each rank's y."""
    fns = {"column": column_parallel_matmul, "row": row_parallel_matmul}
    if how not in fns:
        raise ValueError(f"how must be 'column' or 'row'; got {how!r}")
    dim, what = (w.shape[1], "columns of w") if how == "column" else (w.shape[0], "rows of w")
    if x.shape[1] != w.shape[0]:
        raise ValueError(f"x {tuple(x.shape)} @ w {tuple(w.shape)}: inner sizes differ")
    if dim % world_size:
        raise ValueError(f"{dim} {what} cannot be split evenly over {world_size} ranks: use a "
                         f"world_size dividing {dim}")
    return launch(fns[how], x, w, world_size=world_size)
