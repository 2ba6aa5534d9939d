"""The same composition from PyTorch's own APIs, as torchtitan builds it (06e_composed_parallelism):
the model first split into pipeline stages, then on each stage ``parallelize_module`` (tensor
parallel) on the "tp" mesh dimension and ``fully_shard`` (FSDP2, data parallel) on "dp", the
stages driven by ``torch.distributed.pipelining`` (1F1B) over "pp", all on the one DeviceMesh of
``ParallelDims``. Checked equal to one process and to ``composed`` in
``experiments.composed_runs``; it runs on CPU with gloo (torch 2.13).
"""
from __future__ import annotations

import logging
import warnings

import torch

from labutils.parallel.composed import gpt_loss, make_gpt
from labutils.parallel.model_parallel import split_model
from labutils.parallel.tensor_parallel import TransformerLayer


def qkv_rank_major(tensor, tp, inverse=False):
    """Reorder a fused q,k,v weight's rows so that contiguous slice r is [q_r; k_r; v_r].

    ``ColwiseParallel`` gives rank r the r-th contiguous slice of the rows; on a fused q,k,v
    that would be all of q and half of k with tp=2 (with tp=4: q split between ranks 0 and
    1). Ours shards each block (``shard(groups=3)``); torchtitan keeps wq, wk, wv apart.
    ``inverse=True`` undoes it (to compare gradients).
    """
    if inverse:
        parts = [p.chunk(3, dim=0) for p in tensor.chunk(tp, dim=0)]    # per rank: q_r, k_r, v_r
        return torch.cat([torch.cat([parts[r][b] for r in range(tp)]) for b in range(3)])
    blocks = tensor.chunk(3, dim=0)
    return torch.cat([b.chunk(tp, dim=0)[r] for r in range(tp) for b in blocks])


def parallelize_stage(stage, mesh, tp):
    """Tensor parallel (Megatron's column then row) on each transformer layer, as DTensors."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    for layer in stage.children():
        if isinstance(layer, TransformerLayer):
            with torch.no_grad():
                for t in (layer.attn.qkv.weight, layer.attn.qkv.bias):
                    t.copy_(qkv_rank_major(t, tp))
            parallelize_module(layer, mesh["tp"], {
                "attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()})
            layer.attn.num_heads //= tp            # each rank attends with its own heads
    return stage


def torch_composed_worker(rank, world_size, dims, x, y, model_kwargs=None, n_microbatches=2,
                          steps=2, lr=0.1):
    """``composed_worker``'s training with PyTorch's pieces. Returns ``coords``, ``losses``
    (last stage: the mean over this rank's data slice), ``grads`` after the first step and
    ``params`` after the last, each the whole tensor of this stage (``full_tensor``), q,k,v rows
    back in the model's order."""
    from torch.distributed import pipelining
    from torch.distributed.fsdp import fully_shard
    torch.set_default_dtype(torch.float64)
    # FSDP2 warns that the stage returns a view (no in-place op follows here), and DTensor that
    # full_tensor() of a 2-D (dp, tp) shard takes two all-gathers: neither concerns this check.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    dims.validate(world_size)
    mesh, me = dims.build_mesh(), dims.coords(rank)
    stage = split_model(make_gpt(**(model_kwargs or {})), dims.pp)[me.pp_rank]
    parallelize_stage(stage, mesh, dims.tp)                              # 1. tp
    for layer in stage.children():                                      # 2. dp: FSDP2, layer
        if isinstance(layer, TransformerLayer):                          # by layer, then root
            fully_shard(layer, mesh=mesh["dp"])
    fully_shard(stage, mesh=mesh["dp"])
    pipe = pipelining.PipelineStage(stage, me.pp_rank, dims.pp, torch.device("cpu"),  # 3. pp
                                    group=mesh.get_group("pp"))
    schedule = pipelining.Schedule1F1B(pipe, n_microbatches, loss_fn=gpt_loss)
    optimizer = torch.optim.SGD(stage.parameters(), lr=lr)
    x, y = x.chunk(dims.dp)[me.dp_rank], y.chunk(dims.dp)[me.dp_rank]
    losses, grads = [], None
    for _ in range(steps):
        mb_losses = []
        if me.pp_is_first_stage:
            schedule.step(x)
        elif me.pp_is_last_stage:
            schedule.step(target=y, losses=mb_losses)
        else:
            schedule.step()
        if mb_losses:
            losses.append(sum(loss.item() for loss in mb_losses) / len(mb_losses))
        if grads is None:
            grads = _whole(stage, dims.tp, "grad")
        optimizer.step()
        optimizer.zero_grad()
    return {"coords": me.as_dict(), "losses": losses, "grads": grads,
            "params": _whole(stage, dims.tp, "data")}


def _whole(stage, tp, what):
    out = {}
    for name, p in stage.named_parameters():
        t = getattr(p, what)
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        out[name] = qkv_rank_major(t, tp, inverse=True) if ".qkv." in name else t.clone()
    return out
