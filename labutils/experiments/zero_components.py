"""The general ZeRO components on the course's small GPT (06c2): ``zero3.Zero3Module`` wrapping
``CharGPT`` (head tied to the token embedding) checked against PyTorch's FSDP2 and one process,
and ``zero_optimizer.ZeroOptimizer`` around ``torch.optim.AdamW`` used like any optimizer.

Small on purpose (2 blocks of width 16, 3 steps): the lab shows that the same lines train any
module; ``tests/test_zero3.py`` and ``tests/test_zero_optimizer.py`` test them at length.

The three ways and the reference train in float64. The ranks sum each gradient in another
order than one process, and AdamW divides a gradient by its own magnitude, so in float32 a
last-bit difference in a near-zero element (where Intel's and AMD's GEMM kernels round
differently) can grow to 1e-5 in a weight within 3 steps. In float64 the same difference is
~1e-16 relative and the default tolerance of ``assert_close`` holds on every CPU.
"""
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from labutils.core.launcher import launch
from labutils.data.models import Block, CharGPT
from labutils.parallel.zero3 import Zero3Module
from labutils.parallel.zero_optimizer import ZeroOptimizer

VOCAB, T, BATCH, STEPS = 13, 8, 6, 3
DTYPE = torch.float64  # see the module's docstring


def gpt_problem(seed=0, dtype=torch.float32):
    """A seeded 2-block ``CharGPT`` whose head shares the token embedding's weight (as GPT-2),
    and ``STEPS`` batches of token ids and next-token targets."""
    torch.manual_seed(seed)
    model = CharGPT(VOCAB, block_size=T, n_embd=16, n_head=2, n_layer=2).to(dtype)
    model.head.weight = model.tok_emb.weight  # tied: one parameter used by two modules
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(VOCAB, (STEPS, BATCH, T), generator=g)
    y = torch.randint(VOCAB, (STEPS, BATCH, T), generator=g)
    return model, x, y


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


def train(model, opt, x, y, rank=0, world_size=1):
    """``STEPS`` steps on this rank's slice of each batch; returns the global losses."""
    losses = []
    for step in range(STEPS):
        xs, ys = x[step].chunk(world_size)[rank], y[step].chunk(world_size)[rank]
        loss = F.cross_entropy(model(xs).flatten(0, 1), ys.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    losses = torch.stack(losses)
    if world_size > 1:
        dist.all_reduce(losses)  # the mean of the ranks' equal-sized slices
    return losses / world_size


def one_process():
    """The reference: the whole batch, one process, plain AdamW."""
    model, x, y = gpt_problem(dtype=DTYPE)
    losses = train(model, adamw(model.parameters()), x, y)
    return {"losses": losses, "params": {n: p.detach() for n, p in model.named_parameters()}}


def components_worker(rank, world_size):
    """Worker: the same GPT trained three ways on this rank: our ZeRO-3 (a unit per Block,
    Embedding and Linear), PyTorch's FSDP2 (``fully_shard`` per Block and on the root), and the
    bare model with ``ZeroOptimizer(..., torch.optim.AdamW, stage=2)``. Full weights by name."""
    from torch.distributed.device_mesh import (
        init_device_mesh,  # loads DTensor: only here
    )
    from torch.distributed.fsdp import fully_shard
    out = {}
    model, x, y = gpt_problem(dtype=DTYPE)
    model = Zero3Module(model, unit={Block, nn.Embedding, nn.Linear})
    out["zero3"] = {"losses": train(model, adamw(model.parameters()), x, y, rank, world_size),
                    "params": model.full_parameters()}

    model, x, y = gpt_problem(dtype=DTYPE)
    mesh = init_device_mesh("cpu", (world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    with warnings.catch_warnings():
        # CharGPT returns a view; FSDP2 warns that an in-place op on it would skip a hook.
        # train() does none, and the warning would repeat on every rank and step.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
        losses = train(model, adamw(model.parameters()), x, y, rank, world_size)
    out["fsdp2"] = {"losses": losses,
                    "params": {n: p.full_tensor().detach() for n, p in model.named_parameters()}}

    model, x, y = gpt_problem(dtype=DTYPE)
    opt = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=2, lr=1e-2,
                        weight_decay=0.1)  # no DDP: it averages the gradients itself
    out["zero_optimizer"] = {"losses": train(model, opt, x, y, rank, world_size),
                             "params": {n: p.detach().clone()
                                        for n, p in model.named_parameters()}}
    return out


def run_components(world_size=2):
    """``components_worker`` on real ranks: {way: rank 0's result}, every rank checked
    bitwise equal to rank 0 first (each holds the same gathered bytes), and "one process": the
    reference."""
    results = launch(components_worker, world_size=world_size)
    for rank, res in enumerate(results[1:], 1):
        for way, got in res.items():
            for name, p in got["params"].items():
                assert torch.equal(p, results[0][way]["params"][name]), (
                    f"{way}: rank {rank} holds other bytes than rank 0 for {name}")
    return {**results[0], "one process": one_process()}


def assert_same(got, want, what):
    """Losses of every step and every named final weight equal (``assert_close`` defaults)."""
    torch.testing.assert_close(got["losses"], want["losses"], msg=lambda m: f"{what}, losses: {m}")
    assert got["params"].keys() == want["params"].keys(), what
    for name, p in want["params"].items():
        torch.testing.assert_close(got["params"][name], p,
                                   msg=lambda m, name=name: f"{what}, {name}: {m}")
