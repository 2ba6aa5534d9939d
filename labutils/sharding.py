"""ZeRO stages 1, 2 and 3 from scratch on reduce-scatter and all-gather (Rajbhandari et al.,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020).

Used by ``06c_sharding_and_memory``. Each of the ``world_size`` data-parallel ranks owns one
equal slice (a *shard*) of every parameter, flattened and padded to a multiple of world_size:

* stage 1 (P_os): every rank keeps full weights and full gradients; after backward the
  gradients are reduce-scattered, each rank runs Adam on its shard only (1/N of the optimiser
  state), and the updated shards are all-gathered back into the full weights.
* stage 2 (P_os+g): the same, but each gradient is reduce-scattered the moment backward has
  produced it (a post-accumulate-grad hook) and the full gradient is freed at once.
* stage 3 (P_os+g+p): only shards of the weights exist; a layer all-gathers its weight just
  before it is used, forward and again backward, and drops it right after.

gloo on CPU runs ``reduce_scatter_single`` and ``all_gather_single`` (torch 2.13's names for
``reduce_scatter_tensor`` / ``all_gather_into_tensor``), checked by ``tests/test_sharding.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .launcher import progress
from .tensor_parallel import CommCounter

# Volume in the paper's units: an all-reduce of n bytes is a reduce-scatter plus an
# all-gather, each moving (N-1)/N * n per rank, so it counts twice (paper, section 7).
VOLUME_FACTOR = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}


@dataclass(frozen=True)
class ShardLayout:
    """This rank's place among the data-parallel ranks that share the model states."""
    rank: int
    world_size: int
    group: object = None
    counter: CommCounter | None = None


def padded(numel, world_size):
    """Smallest multiple of world_size >= numel: every shard has the same length."""
    return -(-numel // world_size) * world_size


def _count(layout, op, full):
    if layout.counter is not None:
        layout.counter.add(op, "step", full.numel() * full.element_size())


def reduce_scatter_mean(full_flat, layout):
    """(padded numel,) summed over ranks -> this rank's shard, divided by world size."""
    _count(layout, "reduce_scatter", full_flat)
    shard = torch.empty(full_flat.numel() // layout.world_size, dtype=full_flat.dtype)
    dist.reduce_scatter_single(shard, full_flat, group=layout.group)
    return shard.div_(layout.world_size)


def all_gather_flat(shard, layout):
    """This rank's shard -> the full (padded numel,) tensor, rank order."""
    full = torch.empty(shard.numel() * layout.world_size, dtype=shard.dtype)
    _count(layout, "all_gather", full)
    dist.all_gather_single(full, shard.contiguous(), group=layout.group)
    return full


def flat_padded(tensor, world_size):
    """``tensor`` flattened into a zero-padded buffer of ``padded(numel)`` elements (a view,
    no copy, when numel already divides evenly)."""
    if tensor.numel() % world_size == 0 and tensor.is_contiguous():
        return tensor.view(-1)
    flat = torch.zeros(padded(tensor.numel(), world_size), dtype=tensor.dtype)
    flat[:tensor.numel()] = tensor.reshape(-1)
    return flat


# ---- plain data parallelism: the reference ------------------------------------------------

class DataParallel:
    """Full model and full Adam on every rank; gradients averaged with one all-reduce."""

    def __init__(self, model, layout, lr):
        self.model, self.layout = model, layout
        self.opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)

    def step(self):
        for p in self.model.parameters():
            _count(self.layout, "all_reduce", p.grad)
            dist.all_reduce(p.grad, group=self.layout.group)
            p.grad.div_(self.layout.world_size)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def full_parameters(self):
        return [p.detach().clone() for p in self.model.parameters()]


# ---- stages 1 and 2 ---------------------------------------------------------------------

class Zero12:
    """ZeRO stage 1 or 2: full weights; Adam state (and with stage 2 gradients) sharded."""

    def __init__(self, model, layout, lr, stage=1):
        self.model, self.layout, self.stage = model, layout, stage
        self.params = list(model.parameters())
        self.flats, self.shards = [], []
        for p in self.params:
            # The weight lives in a padded flat buffer, so this rank's shard is a *view* of it:
            # Adam updates the shard in place and no second copy of the weights exists.
            flat = flat_padded(p.data, layout.world_size)
            p.data = flat[:p.numel()].view_as(p)
            self.flats.append(flat)
            self.shards.append(nn.Parameter(flat.chunk(layout.world_size)[layout.rank]))
        self.opt = torch.optim.Adam(self.shards, lr=lr, foreach=False)
        if stage == 2:
            for p, shard in zip(self.params, self.shards):
                p.register_post_accumulate_grad_hook(
                    lambda p, shard=shard: self._shard_gradient(p, shard))

    def _shard_gradient(self, p, shard):
        shard.grad = reduce_scatter_mean(flat_padded(p.grad, self.layout.world_size),
                                         self.layout)
        p.grad = None  # the full gradient is gone before backward reaches the next layer

    def step(self):
        if self.stage == 1:  # full gradients were kept through backward; shard them now
            for p, shard in zip(self.params, self.shards):
                self._shard_gradient(p, shard)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        for flat, shard in zip(self.flats, self.shards):
            # all-gather the updated shards into the full weights (the shard is part of
            # ``flat``, so send a copy: input and output of a collective must not overlap)
            flat.copy_(all_gather_flat(shard.detach().clone(), self.layout))

    def full_parameters(self):
        return [p.detach().clone() for p in self.params]


# ---- stage 3 ----------------------------------------------------------------------------

class _GatheredLinear(torch.autograd.Function):
    """y = x W^T + b where only shards of W and b are kept: gather, use, drop; in backward
    gather W again and reduce-scatter the weight and bias gradients into shard gradients."""

    @staticmethod
    def forward(ctx, x, weight_shard, bias_shard, layer):
        ctx.save_for_backward(x, weight_shard, bias_shard)
        ctx.layer = layer
        weight, bias = layer.gather()
        return F.linear(x, weight, bias)  # weight and bias are freed on return

    @staticmethod
    def backward(ctx, grad_y):
        x, _, _ = ctx.saved_tensors
        layer, layout = ctx.layer, ctx.layer.layout
        weight, _ = layer.gather()
        grad_y = grad_y.to(weight.dtype)  # under bf16 autocast: gradients kept in fp32
        grad_x = grad_y @ weight
        grad_w = grad_y.reshape(-1, grad_y.shape[-1]).T @ x.reshape(-1, x.shape[-1]).to(weight.dtype)
        grad_b = grad_y.reshape(-1, grad_y.shape[-1]).sum(0)
        return (grad_x.to(x.dtype),
                reduce_scatter_mean(flat_padded(grad_w, layout.world_size), layout),
                reduce_scatter_mean(flat_padded(grad_b, layout.world_size), layout), None)


class Zero3Linear(nn.Module):
    """An ``nn.Linear`` of which this rank keeps only 1/world_size of the weight and bias."""

    def __init__(self, linear, layout):
        super().__init__()
        self.layout, self.weight_shape = layout, linear.weight.shape
        chunk = lambda t: flat_padded(t.detach(), layout.world_size).chunk(  # noqa: E731
            layout.world_size)[layout.rank].clone()
        self.weight_shard = nn.Parameter(chunk(linear.weight))
        self.bias_shard = nn.Parameter(chunk(linear.bias))

    def gather(self):
        n_w, n_b = self.weight_shape.numel(), self.weight_shape[0]
        weight = all_gather_flat(self.weight_shard.detach(), self.layout)[:n_w]
        bias = all_gather_flat(self.bias_shard.detach(), self.layout)[:n_b]
        return weight.view(self.weight_shape), bias

    def forward(self, x):
        return _GatheredLinear.apply(x, self.weight_shard, self.bias_shard, self)


class Zero3:
    """ZeRO stage 3: every ``nn.Linear`` replaced by a ``Zero3Linear``; Adam on the shards."""

    def __init__(self, model, layout, lr):
        self.layout = layout
        for name, child in list(model.named_children()):
            if isinstance(child, nn.Linear):
                setattr(model, name, Zero3Linear(child, layout))
        self.model = model
        self.opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)

    def step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def full_parameters(self):
        out = []
        for layer in self.model.children():
            if isinstance(layer, Zero3Linear):
                weight, bias = layer.gather()
                out += [weight.clone(), bias.clone()]
        return out


def wrap(stage, model, layout, lr):
    """Plain data parallelism (stage 0) or ZeRO stage 1, 2 or 3 around ``model``."""
    if stage == 0:
        return DataParallel(model, layout, lr)
    if stage in (1, 2):
        return Zero12(model, layout, lr, stage)
    if stage == 3:
        return Zero3(model, layout, lr)
    raise ValueError(f"ZeRO stage must be 0 (plain data parallel), 1, 2 or 3; got {stage!r}")


# ---- what the paper predicts --------------------------------------------------------------

def zero_state_bytes(num_params, world_size, stage, weight_bytes=4, grad_bytes=4,
                     optimizer_bytes=8):
    """Model-state bytes per rank (paper, figure 1): weights, gradients and optimiser state,
    the last sharded from stage 1, gradients from 2, weights from 3. Defaults: fp32 Adam
    (momentum and variance, 8 bytes); mixed precision is (2, 2, 12)."""
    psi, n = num_params, world_size
    return (weight_bytes * psi / (n if stage >= 3 else 1)
            + grad_bytes * psi / (n if stage >= 2 else 1)
            + optimizer_bytes * psi / (n if stage >= 1 else 1))


def zero_volume_formula(stage):
    """Communication per step in units of one copy of the parameters (paper, section 7)."""
    return 3.0 if stage == 3 else 2.0


# ---- training on real ranks -------------------------------------------------------------

def make_problem(sizes=(32, 64, 64, 8), batch=16, seed=0):
    """The seeded MLP (``lu.memory.mlp``) and one batch of inputs and class labels."""
    from .memory import mlp
    torch.manual_seed(seed)
    model = mlp(sizes)
    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, sizes[0], generator=generator)
    y = torch.randint(sizes[-1], (batch,), generator=generator)
    return model, x, y


def _storage_bytes(tensors):
    seen = {}
    for t in tensors:
        if t is not None and t.dim() > 0:  # Adam's scalar ``step`` counter is not state
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def held_bytes(trainer):
    """Bytes of model state this rank holds now: weights, gradients, optimiser state."""
    params = list(trainer.model.parameters()) + list(getattr(trainer, "shards", []))
    weights = getattr(trainer, "flats", None) or list(trainer.model.parameters())
    opt_state = [t for s in trainer.opt.state.values() for t in s.values()
                 if isinstance(t, torch.Tensor)]
    return {"weights": _storage_bytes(weights),
            "gradients": _storage_bytes(p.grad for p in params),
            "optimizer": _storage_bytes(opt_state)}


class FSDP2:
    """PyTorch's FSDP2: ``fully_shard`` on each Linear and on the root (CPU mesh, gloo)."""

    def __init__(self, model, layout, lr):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (layout.world_size,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        self.model = fully_shard(model, mesh=mesh)
        self.opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)

    def step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def full_parameters(self):
        return [p.full_tensor().detach() for p in self.model.parameters()]


KINDS = {"dp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": "fsdp"}


def _loss(model, x, y, checkpoint, autocast):
    from torch.utils.checkpoint import checkpoint_sequential
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        # checkpoint: keep only the inputs of 4 segments, recompute the rest in backward
        out = (checkpoint_sequential(model, 4, x, use_reentrant=False) if checkpoint
               else model(x))
        return F.cross_entropy(out.float(), y)


def train_worker(rank, world_size, kind="dp", sizes=(32, 64, 64, 8), batch=16, steps=3,
                 lr=1e-2, seed=0, measure_memory=False, checkpoint=False, autocast=False):
    """Worker: train ``steps`` steps of ``kind`` ("dp" plain data parallel, "zero1", "zero2",
    "zero3", or "fsdp") on this rank's slice of the batch. Returns global losses, the full final
    weights, model state held after the last backward, bytes per step (paper's units), median
    step time and (optionally) peak memory."""
    import time
    model, x, y = make_problem(sizes, batch, seed)
    layout = ShardLayout(rank, world_size, counter=CommCounter())
    x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
    trainer = (FSDP2(model, layout, lr) if kind == "fsdp"
               else wrap(KINDS[kind], model, layout, lr))
    state, times = {}, []

    def run():
        losses = []
        for step in range(steps):
            progress(step + 1, steps, "steps")  # rank 0 drives a panel's bar
            start = time.perf_counter()
            loss = _loss(trainer.model, x, y, checkpoint, autocast)
            loss.backward()
            if step == steps - 1 and kind != "fsdp":
                state.update(held_bytes(trainer))  # after backward, before the update
            trainer.step()
            times.append(time.perf_counter() - start)
            losses.append(loss.detach())
        return torch.stack(losses)

    before = (sum(p.to_local().numel() * 4 for p in trainer.model.parameters())
              if kind == "fsdp" else held_bytes(trainer)["weights"])
    if measure_memory:
        from .memory import measure_peak
        losses, peak = measure_peak(run)
    else:
        losses, peak = run(), 0
    volume = sum(VOLUME_FACTOR[op] * b for op, _, b in layout.counter.records) / steps
    params = trainer.full_parameters()
    if measure_memory:  # time as many steps again without the profiler (it slows every op)
        times.clear()
        run()
    dist.all_reduce(losses)  # the global loss: mean of the ranks' (equal-sized) batches
    return {"losses": losses / world_size, "params": params,
            "state": state, "volume_bytes_per_step": volume,
            "step_time": sorted(times[1:] or times)[len(times[1:] or times) // 2],
            "peak_bytes": before + peak if measure_memory else None}


def train_single(sizes=(32, 64, 64, 8), batch=16, steps=3, lr=1e-2, seed=0, checkpoint=False,
                 autocast=False):
    """The single-process reference: the whole batch, one model, Adam."""
    model, x, y = make_problem(sizes, batch, seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
    losses = []
    for _ in range(steps):
        loss = _loss(model, x, y, checkpoint, autocast)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return {"losses": torch.stack(losses), "params": [p.detach() for p in model.parameters()]}


def check_run_config(kind, world_size, batch):
    """Refuse a bad configuration before any process starts."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if batch % world_size:
        raise ValueError(f"batch {batch} does not split evenly over {world_size} ranks; use a "
                         f"batch that is a multiple of {world_size}")


def run_training(kind="dp", world_size=2, **kwargs):
    """Check the configuration, then ``train_worker`` on ``world_size`` ranks. Asserts every
    rank ends with the same weights; returns rank 0's result and every rank's peak memory."""
    from .tensor_parallel import launch_quietly
    check_run_config(kind, world_size, kwargs.get("batch", 16))
    results = launch_quietly(train_worker, kind, world_size=world_size, **kwargs)
    for rank, res in enumerate(results[1:], 1):
        for got, expected in zip(res["params"], results[0]["params"]):
            torch.testing.assert_close(got, expected, msg=lambda m: f"rank {rank}: {m}")
    out = dict(results[0])
    out["peak_bytes_per_rank"] = [r["peak_bytes"] for r in results]
    return out


def assert_same_training(result, reference, what="training"):
    """Losses of every step and every final weight equal (``torch.testing.assert_close``)."""
    torch.testing.assert_close(result["losses"], reference["losses"],
                               msg=lambda m: f"{what}, losses: {m}")
    assert len(result["params"]) == len(reference["params"]), what
    for i, (got, expected) in enumerate(zip(result["params"], reference["params"])):
        torch.testing.assert_close(got, expected, msg=lambda m: f"{what}, parameter {i}: {m}")


# ---- a 2-D layout: data parallel x tensor parallel on one DeviceMesh ----------------------

def _mlp_problem(hidden, batch, seq, seed):
    from .tensor_parallel import MLP
    torch.manual_seed(seed)
    model = MLP(hidden)
    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, seq, hidden, generator=generator)
    target = torch.randn(batch, seq, hidden, generator=generator)
    return model, x, target


def mesh_2d_worker(rank, world_size, dp_size=2, tp_size=2, hidden=16, batch=8, seq=4,
                   steps=3, lr=0.05, seed=0):
    """Worker: a (dp, tp) DeviceMesh; the MLP is tensor-parallel (Megatron, ours) inside each
    "tp" group, data-parallel across the "dp" groups (gradients all-reduced there)."""
    from torch.distributed.device_mesh import init_device_mesh

    from .tensor_parallel import ParallelMLP, TPLayout
    mesh = init_device_mesh("cpu", (dp_size, tp_size), mesh_dim_names=("dp", "tp"))
    dp_rank, tp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    dp_group = mesh.get_group("dp")
    ref, x, target = _mlp_problem(hidden, batch, seq, seed)
    model = ParallelMLP(ref, TPLayout(tp_rank, tp_size, group=mesh.get_group("tp")))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, target = x.chunk(dp_size)[dp_rank], target.chunk(dp_size)[dp_rank]  # my data slice
    losses = []
    for _ in range(steps):
        loss = F.mse_loss(model(x), target)
        loss.backward()
        for p in model.parameters():  # data parallel: average over the dp group only
            dist.all_reduce(p.grad, group=dp_group)
            p.grad.div_(dp_size)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    losses = torch.stack(losses)
    dist.all_reduce(losses, group=dp_group)
    return {"dp_rank": dp_rank, "tp_rank": tp_rank, "losses": losses / dp_size,
            "params": {n: p.detach() for n, p in model.named_parameters()}}


def mlp_train_single(hidden=16, batch=8, seq=4, steps=3, lr=0.05, seed=0):
    """Single-process reference for the 2-D layout: the whole batch, SGD."""
    model, x, target = _mlp_problem(hidden, batch, seq, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return {"losses": torch.stack(losses),
            "params": {n: p.detach() for n, p in model.named_parameters()}}


def run_mesh_2d(world_size=4, mesh_shape=(2, 2), hidden=16, batch=8, seq=4, steps=3, lr=0.05,
                seed=0):
    """Check the mesh, train on it, assert every rank equal to single-process training
    (losses, and each rank's weight shards equal to the matching slices)."""
    from .tensor_parallel import TPLayout, check_tp_config, launch_quietly, reference_shards
    dp_size, tp_size = mesh_shape
    if dp_size * tp_size != world_size:
        raise ValueError(f"mesh {dp_size} x {tp_size} = {dp_size * tp_size} ranks but "
                         f"world_size is {world_size}: the mesh must cover every rank once; "
                         f"use a mesh_shape whose product is {world_size}")
    check_tp_config(hidden, None, tp_size)
    if batch % dp_size:
        raise ValueError(f"batch {batch} does not split over {dp_size} data-parallel ranks; "
                         f"use a multiple of {dp_size}")
    results = launch_quietly(mesh_2d_worker, dp_size, tp_size, hidden, batch, seq, steps, lr,
                             seed, world_size=world_size)
    ref = mlp_train_single(hidden, batch, seq, steps, lr, seed)
    for rank, res in enumerate(results):
        torch.testing.assert_close(res["losses"], ref["losses"])
        layout = TPLayout(res["tp_rank"], tp_size)
        for name, p in res["params"].items():
            torch.testing.assert_close(p, reference_shards(name, ref["params"][name], layout),
                                       msg=lambda m: f"rank {rank} {name}: {m}")
    return {"losses": ref["losses"], "coords": [(r["dp_rank"], r["tp_rank"]) for r in results],
            "shapes": {n: tuple(p.shape) for n, p in results[0]["params"].items()}}


# ---- exercise: one ZeRO-1 optimiser step ----------------------------------------------------

def zero1_step(rank, world_size, flat, grad, shard, optimizer):
    """Reference: ``flat`` (the full weights, padded) and ``grad`` (this rank's full local
    gradient) are the same size; ``shard`` is this rank's slice of ``flat`` and the only
    tensor ``optimizer`` knows. Update ``flat`` in place as data parallelism would."""
    grad_shard = torch.empty_like(shard)
    dist.reduce_scatter_single(grad_shard, grad)          # my slice, summed over ranks
    shard.grad = grad_shard / world_size                  # the mean, as data parallelism
    optimizer.step()                                      # state exists for my slice only
    optimizer.zero_grad()
    dist.all_gather_single(flat, shard.detach().clone())  # every rank gets every slice


def _zero1_harness(rank, world_size, learner_fn, seed, numel, steps=2):
    torch.manual_seed(seed)
    n = padded(numel, world_size)
    start = torch.randn(n)
    grads = [[torch.randn(n) for _ in range(world_size)] for _ in range(steps)]
    full = nn.Parameter(start.clone())  # reference: one process, mean gradient, full state
    full_opt = torch.optim.SGD([full], lr=0.1, momentum=0.9)
    for step in range(steps):
        full.grad = sum(grads[step]) / world_size
        full_opt.step()
    flat = start.clone()
    shard = nn.Parameter(flat.chunk(world_size)[rank])  # a view: updating it updates flat
    optimizer = torch.optim.SGD([shard], lr=0.1, momentum=0.9)
    for step in range(steps):
        learner_fn(rank, world_size, flat, grads[step][rank].clone(), shard, optimizer)
    return full.detach(), flat


def check_zero1_step(learner_fn, *, timeout=90.0):
    """Check ``learner_fn(rank, world_size, flat, grad, shard, optimizer)`` over two steps of
    SGD with momentum: every rank's ``flat`` equals single-process training on the mean
    gradient."""
    from .exercises import make_cases, run_check
    cases = make_cases(world_sizes=(2, 4), per_world_size=1, seed=7, numel=[8, 12, 20])
    return run_check("zero1_step", learner_fn, _zero1_harness, cases, timeout=timeout)


# ---- benchmark: ``python -m labutils.bench zero`` -------------------------------------------

def bench_zero(quick=False):
    """Per-rank memory of each ZeRO stage and FSDP2: measured peak vs the paper's formula."""
    from .bench import Row
    sizes = (64,) + (128,) * 6 + (8,)
    psi = sum(p.numel() for p in make_problem(sizes)[0].parameters())
    rows = []
    for world_size in (2,) if quick else (2, 4):
        for kind in KINDS:
            res = run_training(kind, world_size, sizes=sizes, batch=16, steps=2,
                               measure_memory=True)
            formula = zero_state_bytes(psi, world_size, 3 if kind == "fsdp" else KINDS[kind])
            peak = max(res["peak_bytes_per_rank"])
            rows.append(Row("zero", f"{kind}, {world_size} ranks: measured peak / formula",
                            peak / formula, "ratio",
                            f"peak {peak / 2**20:.3f} MiB, model-state formula "
                            f"{formula / 2**20:.3f} MiB, psi={psi}"))
    return rows
