"""Every DDP version of 04a trained side by side with one process: a small model of mixed
parameter sizes, its batches, the single-process reference and the data-parallel run."""
import contextlib
import os
import sys

import torch
from torch import nn

from labutils.core.commcount import count_collectives
from labutils.core.rank import progress
from labutils.parallel.ddp import BucketedDDP, HookedDDP, naive_allreduce_grads


class MixedNet(nn.Module):
    """Parameters from 1 to 16k numbers; ``aux`` is used only when ``use_aux`` is true.
    ``head_dtype=torch.float64`` makes ``head`` float64, the rest staying float32: a model of
    mixed dtypes, whose gradients cannot share one flat bucket."""

    def __init__(self, d_in=16, hidden=64, d_out=4, head_dtype=None):
        super().__init__()
        self.embed = nn.Linear(d_in, hidden)         # 1024 + 64
        self.scale = nn.Parameter(torch.ones(1))     # a single number
        self.big = nn.Linear(hidden, 4 * hidden)     # 16384 + 256
        self.head = nn.Linear(4 * hidden, d_out, dtype=head_dtype)   # 1024 + 4
        self.aux = nn.Linear(hidden, d_out)          # skipped in some steps

    def forward(self, x, use_aux=True):
        h = torch.relu(self.embed(x)) * self.scale   # (B, hidden)
        z = torch.relu(self.big(h))                  # (B, 4 hidden)
        out = self.head(z.to(self.head.weight.dtype)).to(z.dtype)   # (B, d_out)
        return out + self.aux(h) if use_aux else out


def make_batches(steps, batch_size, d_in=16, d_out=4, seed=0, dtype=torch.float32):
    """Deterministic regression batches: a list of (X, y), the same in every process."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch_size, d_in, generator=g).to(dtype),
             torch.randn(batch_size, d_out, generator=g).to(dtype)) for _ in range(steps)]


def uses_aux(step, rank=0, pattern="even"):
    """Which steps use the ``aux`` branch: on even steps ("even"), or only on rank 0 ("rank0")."""
    return step % 2 == 0 if pattern == "even" else rank == 0


@contextlib.contextmanager
def _silence_stderr(enabled=True):
    """Send this process's file descriptor 2 (C++ warnings too) to /dev/null for a while."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def train_reference(steps=4, batch_size=12, seed=0, lr=0.1, aux_pattern="even", world_size=2,
                    dtype=torch.float32):
    """Single process, whole batch: the result every data-parallel version must reproduce.

    ``dtype=torch.float64`` for equality checks: data parallelism sums the gradient in another
    order than one process, and in float64 any order agrees to ~1e-16 relative, so the default
    tolerance of ``assert_close`` holds on every CPU and math library (in float32 the last bits
    of a GEMM differ between Intel's and AMD's kernels)."""
    torch.manual_seed(seed)
    model = MixedNet().to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    shard = batch_size // world_size
    for step, (X, y) in enumerate(make_batches(steps, batch_size, seed=seed + 1, dtype=dtype)):
        progress(step + 1, steps, "steps")  # rank 0 drives a panel's bar
        opt.zero_grad()
        if aux_pattern == "even":
            loss = nn.functional.mse_loss(model(X, use_aux=uses_aux(step)), y)
        else:  # the aux branch runs on rank 0's shard only: the mean of the per-shard losses
            loss = sum(nn.functional.mse_loss(model(X[r * shard:(r + 1) * shard],
                                                    use_aux=uses_aux(step, r, aux_pattern)),
                                              y[r * shard:(r + 1) * shard])
                       for r in range(world_size)) / world_size
        loss.backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def train_data_parallel(rank, world_size, version="bucketed", steps=4, batch_size=12, seed=0,
                        lr=0.1, aux_pattern="even", bucket_cap_mb=0.02, sync=None,
                        dtype=torch.float32):
    """Train MixedNet on this rank's shard with one DDP version; return final weights and
    ``{"allreduces": n}``, the all-reduce calls this rank issued in the ``steps`` steps, counted
    at the c10d layer (``core.commcount``) under one definition for every version.

    ``version``: "naive", "hooks", "bucketed", "torch" (``DistributedDataParallel``) or
    "custom" with ``sync(model)`` called after backward (an exercise's learner function).
    ``dtype``: as ``train_reference``.
    """
    torch.manual_seed(seed)
    model = MixedNet().to(dtype)
    if version == "hooks":
        wrapped = HookedDDP(model)
    elif version == "bucketed":
        wrapped = BucketedDDP(model, bucket_cap_mb=bucket_cap_mb, find_unused_parameters=True)
    elif version == "torch":
        wrapped = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb,
                                                      find_unused_parameters=True)
    else:
        wrapped = model
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    shard = batch_size // world_size
    # DDP's C++ side warns, with a timestamp, on each step that uses every parameter although
    # find_unused_parameters=True; expected here, so it is kept out of the notebooks' output
    with _silence_stderr(version == "torch"), count_collectives() as counted:
        for step, (X, y) in enumerate(make_batches(steps, batch_size, seed=seed + 1, dtype=dtype)):
            progress(step + 1, steps, "steps")  # rank 0 drives a panel's bar
            X, y = X[rank * shard:(rank + 1) * shard], y[rank * shard:(rank + 1) * shard]
            opt.zero_grad()
            loss = nn.functional.mse_loss(wrapped(X, use_aux=uses_aux(step, rank, aux_pattern)), y)
            loss.backward()
            if version == "naive":
                naive_allreduce_grads(model)
            elif version == "hooks":
                wrapped.wait()
            elif version == "custom":
                sync(model)
            opt.step()
    counts = {"allreduces": counted.all_reduces}   # issued by this rank, counted (not computed)
    return {n: p.detach().clone() for n, p in model.named_parameters()}, counts


def torch_bucket_names(model, bucket_cap_mb):
    """What PyTorch's bucketing function (``_compute_bucket_assignment_by_size``, the one DDP
    calls) returns for ``model``'s parameters in reverse registration order, as lists of names,
    each bucket listed by its first parameter (the reference of 04a's bucket exercise; DDP
    reorders its buckets by gradient arrival after its first step)."""
    names = {id(p): n for n, p in model.named_parameters()}
    reverse = list(reversed(list(model.parameters())))
    indices, _ = torch.distributed._compute_bucket_assignment_by_size(
        reverse, [int(bucket_cap_mb * 2**20)])
    return [[names[id(reverse[i])] for i in bucket] for bucket in indices]
