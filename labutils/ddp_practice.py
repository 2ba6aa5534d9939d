"""Around PyTorch's DistributedDataParallel (04b): communication hooks and the bytes they send,
gradient accumulation with ``no_sync``, and the training script torchrun runs.

* ``register_hook(ddp_model, name)``: plain, fp16, bf16 or PowerSGD averaging, returning an
  ``AllReduceBytes`` counter of what the rank hands to ``dist.all_reduce``;
* ``accumulate_with_no_sync``: k micro-batches, one all-reduce round (the last backward);
* ``train_script``: the 04b script for ``torchrun ... -m labutils.run``.

``lu.ddp`` re-exports all of them.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

# ---- communication hooks and what they send (04b) --------------------------------------------

def bf16_allreduce_hook(group, bucket):
    """Average in bfloat16. PyTorch's ``bf16_compress_hook`` refuses CPU tensors, and DDP
    refuses any hook of that *name* without CUDA and NCCL, hence another name."""
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size(group))
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(f):
        buffer.copy_(f.value()[0])
        return buffer
    return fut.then(decompress)


class AllReduceBytes:
    """``with counter:`` counts the bytes this rank hands to ``dist.all_reduce`` inside it."""

    def __init__(self):
        self.nbytes, self.calls = 0, 0

    def __enter__(self):
        self.original = dist.all_reduce

        def counting(tensor, *args, **kwargs):
            self.nbytes += tensor.numel() * tensor.element_size()
            self.calls += 1
            return self.original(tensor, *args, **kwargs)
        dist.all_reduce = counting  # hooks call dist.all_reduce, also from their callbacks
        return self

    def __exit__(self, *exc):
        dist.all_reduce = self.original


HOOKS = (None, "fp16", "bf16", "powersgd")


def register_hook(ddp_model, name):
    """Register comm hook ``name`` (one of HOOKS) on a ``DistributedDataParallel`` model;
    return an ``AllReduceBytes`` to wrap ``backward()`` with. ``None`` is plain all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if name not in HOOKS:
        raise ValueError(f"unknown comm hook {name!r}; use one of {HOOKS}")
    if name is None:  # the built-in C++ all-reduce, in Python so its bytes can be counted
        ddp_model.register_comm_hook(None, default_hooks.allreduce_hook)
    elif name == "fp16":
        ddp_model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "bf16":
        ddp_model.register_comm_hook(None, bf16_allreduce_hook)
    else:  # rank-1 approximation after 10 plain steps, with error feedback (Vogels et al. 2019)
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=10, min_compression_rate=2)
        ddp_model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return AllReduceBytes()


def train_script(rank, world_size, **kwargs):
    """The 04b training script (see ``labutils.checkpoint.train_script``), for torchrun:
    ``torchrun --nproc-per-node=2 -m labutils.run labutils.ddp:train_script --steps 20``."""
    from .checkpoint import train_script as script
    return script(rank, world_size, **kwargs)


# ---- gradient accumulation with no_sync (04b) ------------------------------------------------

def accumulate_with_no_sync(ddp_model, micro_batches, loss_fn):
    """Gradients of the mean loss over all micro-batches, with one all-reduce round (the last)."""
    *first, last = micro_batches
    with ddp_model.no_sync():  # backward only accumulates into .grad, no communication
        for X, y in first:
            (loss_fn(ddp_model(X), y) / len(micro_batches)).backward()
    X, y = last
    (loss_fn(ddp_model(X), y) / len(micro_batches)).backward()  # all-reduces the sum


def _no_sync_harness(rank, world_size, learner_fn, seed, micro_batches):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from .ddp import MixedNet, make_batches
    torch.manual_seed(seed)
    model = MixedNet()
    batches = make_batches(micro_batches, 4 * world_size, seed=seed)
    reference = MixedNet()
    reference.load_state_dict(model.state_dict())
    X = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    nn.functional.mse_loss(reference(X), y).backward()  # one process, the whole large batch
    ddp_model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.02)
    calls = []

    def counting_hook(state, bucket):
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)
    ddp_model.register_comm_hook(None, counting_hook)
    mine = [(Xb[rank * 4:(rank + 1) * 4], yb[rank * 4:(rank + 1) * 4]) for Xb, yb in batches]
    # micro-batch i of the large batch = rank r's slices of batches i: the same samples
    learner_fn(ddp_model, mine, nn.functional.mse_loss)
    expected = {"gradients": {n: p.grad for n, p in reference.named_parameters()},
                "backward passes that all-reduced": 1}
    got = {"gradients": {n: p.grad for n, p in model.named_parameters()},
           "backward passes that all-reduced": calls.count(0)}  # bucket 0 opens each round
    return expected, got


def check_no_sync_accumulation(learner_fn, *, timeout=60.0):
    """Check ``learner_fn(ddp_model, micro_batches, loss_fn)``: afterwards ``.grad`` holds the
    gradient of the mean loss over all micro-batches of all ranks, and DDP all-reduced each
    only once (in the last backward)."""
    from .exercises import make_cases, run_check
    cases = make_cases(world_sizes=(2, 3), per_world_size=1, seed=7, micro_batches=[2, 3, 4])
    return run_check("no_sync_accumulation", learner_fn, _no_sync_harness, cases,
                     timeout=timeout)
