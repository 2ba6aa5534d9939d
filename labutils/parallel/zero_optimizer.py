"""ZeRO stages 1 and 2 as a ``torch.optim.Optimizer`` (Rajbhandari et al., SC 2020, P_os and
P_os+g): the general, tested version of the lesson's ``sharding.Zero12``
(``06c1_zero_stages``).

    opt = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=2, lr=1e-3, weight_decay=0.1)
    loss.backward(); opt.step(); opt.zero_grad()

Like ``torch.distributed.optim.ZeroRedundancyOptimizer`` it wraps an optimizer class, but it
also averages the gradients itself: use it on the bare model, *without* DDP (DDP would average
them a second time, in a full all-reduce, which is what ZeRO replaces).

Layout: every parameter is flattened into a zero-padded buffer of ``padded(numel, world_size)``
elements (so any world size works) and keeps its data as a view of that buffer; rank r owns
the r-th of ``world_size`` equal slices of each buffer (its *shard*, a view too). The wrapped
optimizer is built on the shards only, so each rank holds 1/world_size of its state.

* stage 1: backward leaves full local gradients in ``p.grad``; ``step()`` reduce-scatters each
  (sum, then / world_size: the mean, as data parallelism) into the shard's gradient and drops
  ``p.grad`` (the full averaged gradient never exists on any rank).
* stage 2: a post-accumulate-grad hook reduce-scatters each gradient the moment backward has
  produced it and sets ``p.grad = None``, so full gradients never pile up. One collective per
  parameter, no buckets (buckets would merge small tensors into fewer calls at the price of a
  bucket-sized buffer); ``p.grad`` stays ``None`` and the averaged gradient exists only as shards.
  Several backward passes before one ``step`` (gradient accumulation) sum into the shards, one
  reduce-scatter per parameter per backward.

Then every rank updates its shards with the wrapped optimizer and all-gathers them into the
full weights. Every rank must produce gradients for the same parameters (as DDP without
``find_unused_parameters``). A parameter listed twice (tied weights) is sharded once.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn


def padded(numel, world_size):
    """Smallest multiple of world_size >= numel: every shard has the same length."""
    return -(-numel // world_size) * world_size


def flat_padded(tensor, world_size):
    """``tensor`` flattened into a zero-padded buffer of ``padded(numel)`` elements (a view,
    no copy, when numel already divides evenly)."""
    if tensor.numel() % world_size == 0 and tensor.is_contiguous():
        return tensor.view(-1)
    flat = torch.zeros(padded(tensor.numel(), world_size), dtype=tensor.dtype,
                       device=tensor.device)
    flat[:tensor.numel()] = tensor.reshape(-1)
    return flat


def reduce_scatter_mean(full_flat, group=None):
    """(padded numel,) local tensor -> this rank's slice of its mean over the group's ranks."""
    world_size = dist.get_world_size(group)
    shard = full_flat.new_empty(full_flat.numel() // world_size)
    dist.reduce_scatter_single(shard, full_flat.contiguous(), group=group)
    return shard.div_(world_size)  # gloo has no ReduceOp.AVG


def all_gather_into(full_flat, shard, group=None):
    """Every rank's ``shard`` into ``full_flat`` (rank order). ``shard`` may be a view of
    ``full_flat``: input and output may share memory only in place (the input exactly this
    rank's slice of the output, as NCCL defines it); a copy is right wherever ``shard`` lies."""
    dist.all_gather_single(full_flat, shard.detach().clone(), group=group)


@torch.no_grad()
def clip_grad_norm_(shards, max_norm, group=None):
    """``torch.nn.utils.clip_grad_norm_`` for gradients held as shards (ZeRO-2/3): the global
    L2 norm needs every rank's squares summed (one all-reduce of a scalar; padding adds zeros).
    Scales the shards' ``.grad`` in place; returns the norm before clipping, on every rank."""
    grads = [s.grad for s in shards if s.grad is not None]
    # sum the squares in at least fp32: bf16 squares would lose the small gradients
    acc = torch.promote_types(grads[0].dtype, torch.float32) if grads else torch.float32
    squares = torch.zeros((), dtype=acc, device=grads[0].device if grads else None)
    for g in grads:
        squares += g.to(acc).pow(2).sum()
    dist.all_reduce(squares, group=group)
    norm = squares.sqrt()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)  # PyTorch's own formula
    for g in grads:
        g.mul_(scale.to(g.dtype))
    return norm


class ZeroOptimizer(torch.optim.Optimizer):
    """``optimizer_class(**defaults)`` on this rank's shards, ZeRO stage 1 or 2 (see the module).

    ``params``: parameters or param-group dicts, as any optimizer (duplicates counted once).
    ``group``: the data-parallel process group (``None``: the whole world). Its collectives
    are counted from outside, as any (``core.commcount.count_collectives``).

    ``param_groups`` are the user's (full parameters): hyperparameters set there (``lr`` by a
    scheduler) reach the inner optimizer at the next ``step``. ``self.optim`` is the inner
    optimizer and ``state`` its state (keyed by the shards); ``self.shards[i]`` is the shard of
    ``self.params[i]``, a view of ``self.flats[i]``. ``clip_grad_norm_(max_norm)`` clips by the
    global norm of the averaged gradients (between backward and ``step``).
    ``state_dict()`` is *per rank* (this rank's shards' state): save one file per rank and load
    it into a ``ZeroOptimizer`` with the same world size, rank, stage and parameters.
    """

    def __init__(self, params, optimizer_class, stage=1, group=None, **defaults):
        if stage not in (1, 2):
            raise ValueError(f"ZeroOptimizer does stages 1 and 2; got stage={stage!r} "
                             f"(stage 3 shards the weights too: use zero3.Zero3Module)")
        self.stage, self.group = stage, group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.params, self.flats, self.shards, self._hooks = [], [], [], []
        self.optim = None  # built after the base class has registered every group
        super().__init__(params, defaults)
        shard_groups = [{**{k: v for k, v in g.items() if k != "params"},
                         "params": self._shards_of(g)} for g in self.param_groups]
        self.optim = optimizer_class(shard_groups, **defaults)
        self.state = self.optim.state  # what exists: the state of this rank's shards
        for outer, inner in zip(self.param_groups, self.optim.param_groups):
            outer.update({k: v for k, v in inner.items() if k != "params"})  # e.g. betas

    def add_param_group(self, param_group):
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        # dict.fromkeys keeps the first of each object: a tied weight listed twice is one
        # parameter, one shard, one optimiser state (the base class would only warn)
        super().add_param_group({**param_group, "params": list(dict.fromkeys(params))})
        for p in self.param_groups[-1]["params"]:
            self._shard(p)
        if self.optim is not None:  # a group added after construction
            group = self.param_groups[-1]
            self.optim.add_param_group({**{k: v for k, v in group.items() if k != "params"},
                                        "params": self._shards_of(group)})
            group.update({k: v for k, v in self.optim.param_groups[-1].items() if k != "params"})

    def _shard(self, p):
        # The weight lives in a padded flat buffer and this rank's shard is a view of it: the
        # inner optimizer updates the shard in place, no second copy of the weights exists.
        flat = flat_padded(p.detach(), self.world_size)
        p.data = flat[:p.numel()].view_as(p)
        shard = nn.Parameter(flat.chunk(self.world_size)[self.rank])
        self.params.append(p)
        self.flats.append(flat)
        self.shards.append(shard)
        if self.stage == 2 and p.requires_grad:
            self._hooks.append(p.register_post_accumulate_grad_hook(
                lambda p, shard=shard: self._shard_gradient(p, shard)))

    def _shards_of(self, group):
        index = {id(p): i for i, p in enumerate(self.params)}
        return [self.shards[index[id(p)]] for p in group["params"]]

    def _shard_gradient(self, p, shard):
        grad = reduce_scatter_mean(flat_padded(p.grad, self.world_size), self.group)
        # accumulate: several backward passes before one step sum their gradients
        shard.grad = grad if shard.grad is None else shard.grad.add_(grad)
        p.grad = None  # stage 2: the full gradient is gone before backward moves on

    @torch.no_grad()
    def step(self, closure=None):
        """Average and shard the gradients (stage 1), update this rank's shards, all-gather
        the weights. ``closure`` (optional) is called once, before, to recompute the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.stage == 1:
            self._shard_gradients()
        for outer, inner in zip(self.param_groups, self.optim.param_groups):
            inner.update({k: v for k, v in outer.items() if k != "params"})
        self.optim.step()
        for flat, shard in zip(self.flats, self.shards):
            all_gather_into(flat, shard, self.group)
        return loss

    def _shard_gradients(self):
        for p, shard in zip(self.params, self.shards):
            if p.grad is not None:  # None: already sharded (by clip_grad_norm_) or unused
                shard.grad = reduce_scatter_mean(flat_padded(p.grad, self.world_size),
                                                 self.group)
                p.grad = None  # the averaged gradient now exists as shards only

    def clip_grad_norm_(self, max_norm):
        """Clip as ``torch.nn.utils.clip_grad_norm_`` would on the averaged full gradients;
        call between backward and ``step``. Stage 1 shards the gradients here, not in step."""
        if self.stage == 1:
            self._shard_gradients()
        return clip_grad_norm_(self.shards, max_norm, self.group)

    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none)        # full gradients (stage 1)
        self.optim.zero_grad(set_to_none)     # shard gradients

    def state_dict(self):
        """This rank's state: the inner optimizer's ``state_dict`` (state of its shards,
        hyperparameters) and where it belongs (stage, rank, world size)."""
        return {"zero": {"stage": self.stage, "rank": self.rank, "world_size": self.world_size,
                         "shard_numels": [s.numel() for s in self.shards]},
                "inner": self.optim.state_dict()}

    def load_state_dict(self, state_dict):
        """Load what ``state_dict()`` returned on the same rank of the same configuration."""
        here = self.state_dict()["zero"]
        if state_dict["zero"] != here:
            raise ValueError(f"this state was saved by {state_dict['zero']} but this optimizer "
                             f"is {here}: ZeroOptimizer state is per rank; load each rank's "
                             f"own file into the same configuration")
        self.optim.load_state_dict(state_dict["inner"])
        for outer, inner in zip(self.param_groups, self.optim.param_groups):
            outer.update({k: v for k, v in inner.items() if k != "params"})
