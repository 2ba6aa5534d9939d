"""The training script of 04b: DDP on a workload, with checkpoints every few steps, a resume
from the last one, and a rank killed on purpose to rehearse a crash. The same function runs
under ``lu.launch`` and under torchrun (``python -m labutils.core.run
labutils.experiments.resumable_training:train_script``)."""
from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from labutils.core.commcount import AllReduceBytes
from labutils.core.rank import progress
from labutils.data import workloads
from labutils.parallel import ddp_hooks
from labutils.parallel.checkpoint import (
    ResumableSampler,
    atomic_save,
    latest,
    load,
    save,
)


def _loader(wl, rank, world_size, seed, batch_size):
    """This rank's sampler (it remembers its position, for a resume) and loader."""
    dataset = TensorDataset(*wl.train_set)
    sampler = ResumableSampler(dataset, num_replicas=world_size, rank=rank, seed=seed,
                               drop_last=True)
    # its own generator: a DataLoader iterator otherwise draws a seed from the global RNG
    # each time an epoch starts, so a resumed run would see other augmentation noise
    loader = DataLoader(dataset, batch_size=batch_size // world_size, sampler=sampler,
                        drop_last=True, generator=torch.Generator().manual_seed(seed))
    return sampler, loader


def train_script(rank, world_size, steps=30, ckpt_dir=None, ckpt_every=5, kill_at_step=None,
                 kill_rank=None, seed=0, batch_size=64, lr=0.05, noise=0.1, hook=None,
                 workload="digits", out=None, evaluate=False, kill_attempts=1):
    """Train ``workload`` with ``DistributedDataParallel``; resume from ``ckpt_dir`` if it holds
    a checkpoint; save one every ``ckpt_every`` steps. ``kill_at_step=k`` SIGKILLs rank
    ``kill_rank`` (default: the last) after step k, on the first ``kill_attempts`` attempts
    only (torchrun's ``TORCHELASTIC_RESTART_COUNT`` below it; unset is 0), to rehearse a crash;
    ``kill_attempts=2`` with ``--max-restarts=1`` uses the restarts up.

    Returns ``{"losses": {step: global mean loss}, "start": step resumed from, "state": final
    weights, "accuracy", "allreduce_bytes_per_step" (the mean) and "allreduce_bytes_by_step",
    "restart_count" (torchrun's attempt)}``;
    with ``out=PATH`` rank 0 writes that dict there instead (for torchrun) and returns None.
    """
    wl = workloads.get(workload)
    model = DDP(wl.make_model(seed))
    ddp_hooks.register_hook(model, hook)
    counter = AllReduceBytes()  # what the hook hands to dist.all_reduce, callbacks included
    opt = wl.make_optimizer(model.parameters(), lr)
    sampler, loader = _loader(wl, rank, world_size, seed, batch_size)
    torch.manual_seed(seed + 1000 * (rank + 1))  # each rank its own augmentation noise
    step = start = 0
    if ckpt_dir and latest(ckpt_dir):
        step = start = load(latest(ckpt_dir), model, opt, sampler)["step"]
    kill_rank = world_size - 1 if kill_rank is None else kill_rank
    doomed = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) < kill_attempts
    losses, bytes_by_step = {}, {}
    while step < steps:
        for xb, yb in loader:
            progress(step + 1, steps, "steps")  # rank 0 drives a panel's bar
            xb = xb + noise * torch.randn_like(xb)  # augmentation: uses this rank's RNG
            loss = wl.loss_fn(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            sent = counter.nbytes
            with counter:
                loss.backward()
            opt.step()
            step += 1
            bytes_by_step[step] = counter.nbytes - sent
            report = loss.detach().clone()
            dist.all_reduce(report)
            losses[step] = float(report) / world_size
            if ckpt_dir and step % ckpt_every == 0:
                save(ckpt_dir, step, model, opt, sampler)
            if step == kill_at_step and rank == kill_rank and doomed:
                os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, like a lost machine
            if step >= steps:
                break
        else:  # the epoch is used up
            sampler.set_epoch(sampler.epoch + 1)
    result = {"losses": losses, "start": start,
              "state": {k: v.detach().clone() for k, v in model.module.state_dict().items()},
              "accuracy": wl.metric(model.module) if evaluate else None,
              "allreduce_bytes_per_step": counter.nbytes / max(1, steps - start),
              "allreduce_bytes_by_step": bytes_by_step,
              "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
    if out is None:
        return result
    if rank == 0:
        atomic_save(result, out)
    return None
