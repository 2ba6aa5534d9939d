"""Data inconsistency under data parallelism, measured on real ranks: a sampler whose shuffle
repeats (no ``set_epoch``), and BatchNorm that sees only its own rank's shard.

Used by ``03e1_data_inconsistency``. Every run is synchronous data parallelism on the
digits: the same initial weights on every rank, gradients averaged over the ranks (one flat
all-reduce, or PyTorch's ``DistributedDataParallel``, which averages too), so the ranks' weights
stay equal and only what each rank *sees* differs.

* ``sampler_effect``: ``DistributedSampler(shuffle=True)`` with and without
  ``set_epoch(epoch)``, for several seeds: the batches counted, and the test loss and accuracy
  after each epoch; with ``augment=True`` each sample is randomly cropped (``epoch_crop``) from a
  generator seeded by the sampler's epoch, and the distinct (sample, crop) pairs are counted.
* ``batchnorm_training``: digits split by class (rank 0 the digits 0-4, rank 1 the digits 5-9, a
  non-IID split), a net with BatchNorm, trained under PyTorch's DDP with plain BatchNorm
  (``broadcast_buffers`` True, the default, or False) or with our ``SyncBatchNorm``; returns
  each rank's eval-mode test accuracy and loss, and the running means each rank held when each
  forward began (to show what ``broadcast_buffers`` does).
* ``batchnorm_step``: one step of the same net on those shards, for comparison with one process
  on the whole batch (outputs, running statistics, gradients).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from labutils.core.launcher import launch
from labutils.core.rank import progress
from labutils.data.datasets import digits
from labutils.parallel.sync_batchnorm import SyncBatchNorm

BN_MODES = ("plain, broadcast_buffers=True", "plain, broadcast_buffers=False", "SyncBatchNorm")


def _data():
    X, y = digits("train")
    Xt, yt = digits("test")
    return X.flatten(1), y, Xt.flatten(1), yt


def _evaluate(model, Xt, yt):
    model.eval()
    with torch.no_grad():
        out = model(Xt)
    model.train()
    return F.cross_entropy(out, yt).item(), (out.argmax(1) == yt).float().mean().item()


def epoch_crop(image, index, epoch, seed=0):
    """A random crop with padding 1 of one (1, 8, 8) image, as torchvision's
    ``RandomCrop(8, padding=1)``; returns (crop, (dy, dx)). The draw is seeded by (seed, epoch,
    index), as reproducible pipelines seed augmentation from the sampler's epoch: a fixed
    epoch (no ``set_epoch``) gives every sample the same crop every epoch."""
    g = torch.Generator().manual_seed((seed * 1000 + epoch) * 100_000 + index)
    dy, dx = torch.randint(0, 3, (2,), generator=g).tolist()
    return F.pad(image, (1, 1, 1, 1))[..., dy:dy + 8, dx:dx + 8], (dy, dx)


def _average_gradients(params, world_size):
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    flat /= world_size                    # the mean of the ranks' gradients, as DDP computes
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(g.view_as(p))


def _sampler_worker(rank, world_size, seeds, epochs, batch_size, lr, augment):
    X, y, Xt, yt = _data()
    images = digits("train")[0]                       # (N, 1, 8, 8), for the crops
    out = {}
    for k, seed in enumerate(seeds):
        for set_epoch in (False, True):
            torch.manual_seed(seed)       # the same initial weights on every rank
            model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
            params = list(model.parameters())
            sampler = DistributedSampler(range(len(X)), num_replicas=world_size, rank=rank,
                                         shuffle=True, seed=seed)
            batches, pairs, losses, accs = set(), set(), [], []
            for epoch in range(epochs):
                if set_epoch:
                    sampler.set_epoch(epoch)
                order = torch.tensor(list(sampler))
                for idx in order.split(batch_size):
                    batches.add(tuple(sorted(idx.tolist())))
                    xb = X[idx]
                    if augment:   # the crop's seed comes from the sampler's epoch
                        crops = [epoch_crop(images[i], i, sampler.epoch, seed)
                                 for i in idx.tolist()]
                        xb = torch.stack([c for c, _ in crops]).flatten(1)
                        pairs.update((i, d) for i, (_, d) in zip(idx.tolist(), crops))
                    model.zero_grad()
                    F.cross_entropy(model(xb), y[idx]).backward()
                    _average_gradients(params, world_size)
                    with torch.no_grad():
                        for p in params:
                            p -= lr * p.grad
                loss, acc = _evaluate(model, Xt, yt)
                losses.append(loss)
                accs.append(acc)
            out[(seed, set_epoch)] = {"distinct_batches": len(batches), "test_loss": losses,
                                      "test_accuracy": accs, "distinct_samples":
                                      len({i for b in batches for i in b}),
                                      "distinct_pairs": len(pairs) if augment else None}
        progress(k + 1, len(seeds), "seeds")
    return out


def sampler_effect(seeds=(0, 1, 2, 3, 4), epochs=4, batch_size=16, lr=0.1, world_size=2,
                   augment=False):
    """Train with and without ``set_epoch`` for each seed; rank 0's view. Returns
    {(seed, set_epoch): {"distinct_batches": batches of this rank counted over all epochs,
    "distinct_samples": its distinct sample indices, "distinct_pairs": its distinct (sample,
    crop) pairs when ``augment`` (else None), "test_loss": per epoch, "test_accuracy": per
    epoch}}. ``augment``: train on ``epoch_crop`` crops seeded by the sampler's epoch."""
    return launch(_sampler_worker, tuple(seeds), epochs, batch_size, lr, augment,
                  world_size=world_size, warn_oversubscription=False)[0]


def class_shard(X, y, rank, world_size, shuffle=False):
    """Rank ``rank``'s share of the data sorted by class: a non-IID split. ``shuffle=True``:
    a random split instead (the same permutation on every rank, so the shares stay disjoint)."""
    order = (torch.randperm(len(y), generator=torch.Generator().manual_seed(0)) if shuffle
             else torch.argsort(y, stable=True))
    idx = order.tensor_split(world_size)[rank]
    return X[idx], y[idx]


def make_bn_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))


def _bn_worker(rank, world_size, mode, epochs, batch_size, lr, seed, shuffle):
    X, y, Xt, yt = _data()
    xs, ys = class_shard(X, y, rank, world_size, shuffle)
    net = make_bn_net(seed)
    if mode == "SyncBatchNorm":
        net = SyncBatchNorm.convert(net)
    # broadcast_buffers is called forward_sync_buffers in torch 2.13 (the old name warns)
    model = DDP(net, forward_sync_buffers=(mode != "plain, broadcast_buffers=False"))
    seen = []   # running mean of this rank's BatchNorm when each forward begins (after DDP's
    hook = net[1].register_forward_pre_hook(  # broadcast, if any)
        lambda m, a: seen.append(m.running_mean.clone()))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    steps = len(xs) // batch_size       # the smaller shard sets the count: every rank the same
    steps = torch.tensor(steps)
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    g = torch.Generator().manual_seed(seed * 100 + rank)
    for epoch in range(epochs):
        perm = torch.randperm(len(xs), generator=g)
        for i in range(int(steps)):
            idx = perm[i * batch_size:(i + 1) * batch_size]
            opt.zero_grad()
            F.cross_entropy(model(xs[idx]), ys[idx]).backward()   # DDP averages the gradients
            opt.step()
        progress(epoch + 1, epochs, "epochs")
    hook.remove()
    loss, acc = _evaluate(net, Xt, yt)
    return {"test_loss": loss, "test_accuracy": acc, "running_means": torch.stack(seen),
            "steps": int(steps) * epochs}


def batchnorm_training(mode, epochs=3, batch_size=8, lr=0.1, seed=0, world_size=2,
                       shuffle=False):
    """Train the BatchNorm net on class-sorted shards under DDP (``shuffle=True``: random
    shards); one dict per rank (see the module docstring). ``mode``: one of ``BN_MODES``."""
    if mode not in BN_MODES:
        raise ValueError(f"mode must be one of {BN_MODES}; got {mode!r}")
    return launch(_bn_worker, mode, epochs, batch_size, lr, seed, shuffle, world_size=world_size,
                  warn_oversubscription=False)


def _bn_step_worker(rank, world_size, sync, batch, seed, dtype):
    X, y, _, _ = _data()
    xs, ys = class_shard(X[:batch].to(dtype), y[:batch], rank, world_size)
    net = make_bn_net(seed).to(dtype)
    if sync:
        net = SyncBatchNorm.convert(net)
    out = net(xs)
    F.cross_entropy(out, ys).backward()   # this rank's mean loss (shards of equal size)
    params = list(net.parameters())
    _average_gradients(params, world_size)
    return {"out": out.detach(), "running_mean": net[1].running_mean.clone(),
            "running_var": net[1].running_var.clone(), "grads": [p.grad for p in params]}


def batchnorm_step(sync, batch=96, seed=0, world_size=2, dtype=torch.float32):
    """One step on ``batch`` class-sorted samples split over the ranks (``batch`` divisible by
    ``world_size``); and the same step in this process on the whole batch. Returns
    (per-rank results, reference dict with the same keys). ``dtype=torch.float64`` for
    equality checks: the ranks sum the statistics in another order than one process."""
    if batch % world_size:
        raise ValueError(f"batch={batch} must be divisible by world_size={world_size}")
    ranks = launch(_bn_step_worker, sync, batch, seed, dtype, world_size=world_size,
                   warn_oversubscription=False)
    X, y, _, _ = _data()
    xs, ys = map(torch.cat, zip(*(class_shard(X[:batch], y[:batch], r, world_size)
                                  for r in range(world_size))))
    net = make_bn_net(seed).to(dtype)
    out = net(xs.to(dtype))
    F.cross_entropy(out, ys).backward()
    ref = {"out": out.detach(), "running_mean": net[1].running_mean.clone(),
           "running_var": net[1].running_var.clone(),
           "grads": [p.grad for p in net.parameters()]}
    return ranks, ref
