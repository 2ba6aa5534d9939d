"""Splitting one matmul over ranks (05, the idea behind tensor parallelism): by columns of the
weight (each rank a slice of the output, then all-gather) or by rows (each rank a partial sum,
then all-reduce). ``experiments.model_parallel_runs.run_split_matmul`` launches them."""
from __future__ import annotations

import torch
import torch.distributed as dist


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
