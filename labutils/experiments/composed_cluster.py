"""06e's composed worker as a command, for torchrun on one or several nodes (README, "Running the
composed lab on a cluster"): the same ``parallel.composed.composed_worker`` that
``composed_runs.run_composed`` launches from the notebook, with the layout given as numbers.

    torchrun --nnodes=2 --node-rank=0 --nproc-per-node=4 --rdzv-backend=c10d \\
        --rdzv-endpoint=HOST:29400 -m labutils.core.run --save-result composed.pt \\
        labutils.experiments.composed_cluster:cluster_worker --dp 2 --tp 2 --pp 2

After training, rank 0 gathers every rank's result (``dist.gather_object``, outside the step)
and returns them in rank order, so one saved file can be checked against one process
(``composed_runs.assert_equal_to_one_process``) or against ``lu.launch``'s run.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from labutils.experiments.composed_runs import make_batch
from labutils.parallel.composed import composed_worker, gpt_config, validate_composed
from labutils.cost.parallel_dims import ParallelDims


@dataclass
class ComposedResult:
    """Every rank's ``composed_worker`` result, in rank order, and the layout they ran."""
    dims: ParallelDims
    ranks: list

    def losses(self):
        """The whole batch's loss per step: the mean over the last stage's ranks."""
        last = [r["losses"] for r in self.ranks if r["coords"]["pp"] == self.dims.pp - 1]
        return [sum(step) / len(last) for step in zip(*last)]

    def __repr__(self):
        return f"ComposedResult({self.dims}, {len(self.ranks)} ranks, losses={self.losses()})"


def cluster_worker(rank, world_size, dp=1, tp=1, pp=1, cp=1, batch=8, n_microbatches=2,
                   steps=2, lr=0.1, seed=0):
    """Train the small GPT on the (pp, dp, cp, tp) mesh, as ``run_composed`` does; rank 0
    returns a ``ComposedResult`` of every rank, the others None."""
    dims = ParallelDims(dp=dp, tp=tp, pp=pp, cp=cp)
    cfg = gpt_config()
    validate_composed(dims, world_size, batch, n_microbatches, cfg["hidden"], cfg["num_heads"],
                      cfg["n_layers"], cfg["seq_len"])
    x, y = make_batch(batch, None, seed)
    result = composed_worker(rank, world_size, dims, x, y, n_microbatches=n_microbatches,
                             steps=steps, lr=lr)
    gathered = [None] * world_size if rank == 0 else None
    dist.gather_object(result, gathered, dst=0)
    return ComposedResult(dims, gathered) if rank == 0 else None
