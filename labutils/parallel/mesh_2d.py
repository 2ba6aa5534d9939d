"""A 2-D layout (formerly in 06c): data parallel x tensor parallel on one DeviceMesh, checked
against one process (``experiments.mesh_2d_runs.run_mesh_2d`` launches and checks it). Its mesh
is ``ParallelDims(dp, tp, pp=1)``'s, the layout 06e_composed_parallelism composes further."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from labutils.cost.parallel_dims import ParallelDims
from labutils.parallel.tensor_parallel import (
    MLP,
    ParallelMLP,
    TPLayout,
)


def _mlp_problem(hidden, batch, seq, seed):
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
    mesh = ParallelDims(dp=dp_size, tp=tp_size, pp=1).validate(world_size).build_mesh()
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

