"""Mixed precision counted (06c2): what bf16 autocast leaves in fp32, and what FSDP2's
``MixedPrecisionPolicy`` does to the bytes of its collectives.

* ``autocast_state`` trains one process one Adam step under ``torch.autocast("cpu",
  torch.bfloat16)`` and counts the bytes of weights, gradients and Adam state by dtype: autocast
  casts the inputs of each matmul, never the stored tensors, so all of them stay fp32.
* ``run_fsdp_traffic`` trains FSDP2 one step on real ranks, with fp32 weights and with
  ``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``, and counts
  each collective's bytes at the dispatcher (``core.commcount.count_collectives``).
"""
from collections import Counter

import torch
import torch.nn.functional as F

from labutils.core.commcount import count_collectives
from labutils.core.launcher import launch
from labutils.experiments.zero_training import make_problem
from labutils.parallel.sharding import FSDP2, ShardLayout


def _by_dtype(tensors):
    out = Counter()
    for t in tensors:
        out[str(t.dtype).removeprefix("torch.")] += t.numel() * t.element_size()
    return dict(out)


def autocast_state(sizes=(64, 128, 128, 8), batch=32):
    """One Adam step under bf16 autocast in one process: {"weights", "gradients", "adam"}:
    bytes by dtype, counted after the step (gradients: before ``zero_grad``), and Ψ."""
    model, x, y = make_problem(sizes, batch)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    F.cross_entropy(logits.float(), y).backward()
    opt.step()
    params = list(model.parameters())
    state = [t for s in opt.state.values() for t in s.values() if t.dim() > 0]  # not `step`
    return {"psi": sum(p.numel() for p in params), "logits": str(logits.dtype),
            "weights": _by_dtype(params), "gradients": _by_dtype(p.grad for p in params),
            "adam": _by_dtype(state)}


def fsdp_traffic_worker(rank, world_size, sizes=(64, 128, 128, 8), batch=32, seed=0):
    """Worker: one FSDP2 training step with fp32 all-gathers, then one with bf16 (each on a
    fresh model): bytes handed to each kind of collective, and the dtypes of the shards."""
    out = {}
    for name, param_dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        model, x, y = make_problem(sizes, batch, seed)
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        trainer = FSDP2(model, ShardLayout(rank, world_size), lr=1e-2, param_dtype=param_dtype)
        with count_collectives() as counted:
            loss = F.cross_entropy(trainer.model(x).float(), y)
            loss.backward()
            trainer.step()
        out[name] = {"all_gather": sum(c.nbytes * c.group_size for c in counted.of("allgather")),
                     "reduce_scatter": sum(c.nbytes for c in counted.of("reduce_scatter")),
                     "calls": counted.total,
                     "shard_dtypes": sorted({str(p.dtype) for p in trainer.model.parameters()}),
                     "loss": loss.detach()}
    return out


def run_fsdp_traffic(world_size=2, sizes=(64, 128, 128, 8), batch=32):
    """``fsdp_traffic_worker`` on ``world_size`` real ranks; rank 0's counts."""
    if batch % world_size:
        raise ValueError(f"batch {batch} does not split evenly over {world_size} ranks; use a "
                         f"batch that is a multiple of {world_size}")
    return launch(fsdp_traffic_worker, sizes, batch, world_size=world_size,
                  warn_oversubscription=False)[0]
