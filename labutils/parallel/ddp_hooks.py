"""Around PyTorch's DistributedDataParallel (04b): communication hooks and the bytes they send,
and gradient accumulation with ``no_sync``.

* ``register_hook(ddp_model, name)``: plain, fp16, bf16 or PowerSGD averaging (the bytes they
  send are counted from outside: ``core.commcount.AllReduceBytes``);
* ``accumulate_with_no_sync``: k micro-batches, one all-reduce round (the last backward).

The script torchrun runs in 04b is ``labutils.experiments.resumable_training.train_script``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

# ---- communication hooks and what they send (04b) --------------------------------------------

def bf16_allreduce_hook(group, bucket):
    """Average in bfloat16, as PyTorch's ``bf16_compress_hook`` does. DDP's
    ``register_comm_hook`` refuses a hook of that *name* without CUDA and NCCL >= 2.10 (or XPU),
    so on a CPU this one, under another name, does the same with ``dist.all_reduce``."""
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size(group))
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(f):
        buffer.copy_(f.value()[0])
        return buffer
    return fut.then(decompress)


HOOKS = (None, "fp16", "bf16", "powersgd")
POWERSGD_WARMUP = 10   # plain all-reduce steps before PowerSGD compresses (start_powerSGD_iter)


def register_hook(ddp_model, name):
    """Register comm hook ``name`` (one of HOOKS) on a ``DistributedDataParallel`` model.
    ``None`` is plain all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if name not in HOOKS:
        raise ValueError(f"unknown comm hook {name!r}; use one of {HOOKS}")
    if name is None:  # the built-in C++ all-reduce, as a Python hook like the others
        ddp_model.register_comm_hook(None, default_hooks.allreduce_hook)
    elif name == "fp16":
        ddp_model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "bf16":
        ddp_model.register_comm_hook(None, bf16_allreduce_hook)
    else:  # rank-1 approximation after 10 plain steps, with error feedback (Vogels et al. 2019)
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=POWERSGD_WARMUP,
                                            min_compression_rate=2)
        ddp_model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


# ---- gradient accumulation with no_sync (04b) ------------------------------------------------

def accumulate_with_no_sync(ddp_model, micro_batches, loss_fn):
    """Gradients of the mean loss over all micro-batches, with one all-reduce round (the last)."""
    *first, last = micro_batches
    with ddp_model.no_sync():  # backward only accumulates into .grad, no communication
        for X, y in first:
            (loss_fn(ddp_model(X), y) / len(micro_batches)).backward()
    X, y = last
    (loss_fn(ddp_model(X), y) / len(micro_batches)).backward()  # all-reduces the sum
