"""Ulysses checked (06d2): attention on a sequence shard with all-to-alls, run on real ranks
against one process (outputs and every gradient), its all-to-alls counted at PyTorch's dispatcher
and set beside the formula, and ring attention's K/V traffic from its formula."""
from __future__ import annotations

import torch
import torch.distributed as dist

from labutils.core.commcount import count_collectives
from labutils.core.launcher import launch
from labutils.cost.long_context import ring_kv_bytes, ulysses_bytes
from labutils.parallel.tensor_parallel import SelfAttention
from labutils.parallel.ulysses import UlyssesAttention, validate_ulysses_config

SIZES = {"batch": 2, "seq": 48, "hidden": 48, "num_heads": 12, "seed": 0}


def reference_and_inputs(batch, seq, hidden, num_heads, seed, dtype=torch.float64):
    torch.manual_seed(seed)  # every rank builds the same reference, input and upstream gradient
    ref = SelfAttention(hidden, num_heads).to(dtype)
    x = torch.randn(batch, seq, hidden, dtype=dtype)
    dy = torch.randn(batch, seq, hidden, dtype=dtype)
    return ref, x, dy


def ulysses_attention(rank, world_size, batch=2, seq=48, hidden=48, num_heads=12, seed=0):
    """Worker: forward and backward on this rank's s/N positions; the all-to-alls counted at
    PyTorch's dispatcher (``core.commcount``), calls and bytes by phase."""
    ref, x, dy = reference_and_inputs(batch, seq, hidden, num_heads, seed)
    attn = UlyssesAttention(ref, world_size)
    x = x.chunk(world_size, dim=1)[rank].clone().requires_grad_()
    with count_collectives() as forward_ops:
        y = attn(x)
    with count_collectives() as backward_ops:
        (y * dy.chunk(world_size, dim=1)[rank]).sum().backward()
    # the weights are replicated and each rank saw s/N positions: sum their gradients (what a
    # data-parallel all-reduce over the Ulysses group does once per step)
    grads = {n: p.grad for n, p in attn.named_parameters()}
    for g in grads.values():
        dist.all_reduce(g)
    return {"output": y.detach(), "input_grad": x.grad, "grads": grads,
            "bytes": {"forward": off_rank_bytes(forward_ops),
                      "backward": off_rank_bytes(backward_ops)},
            "calls": {"forward": dict(forward_ops.by_op), "backward": dict(backward_ops.by_op)}}


def off_rank_bytes(counted):
    """Bytes the counted all-to-alls addressed to OTHER ranks: each call was handed N equal
    blocks (``all_to_all_single`` without split sizes), one of which stays with this rank."""
    return sum(c.nbytes * (c.group_size - 1) // c.group_size for c in counted.of("alltoall"))


def assert_matches_reference(results, batch, seq, hidden, num_heads, seed):
    """Every rank's output and input gradient equal its positions of the single-process
    attention's, and every summed weight gradient equals the reference's (float64,
    ``assert_close``'s default tolerances). Returns the largest absolute difference."""
    ref, x, dy = reference_and_inputs(batch, seq, hidden, num_heads, seed)
    x = x.clone().requires_grad_()
    y = ref(x)
    (y * dy).sum().backward()
    world_size, worst = len(results), 0.0
    for rank, res in enumerate(results):
        pairs = [("output", res["output"], y.detach().chunk(world_size, dim=1)[rank]),
                 ("input grad", res["input_grad"], x.grad.chunk(world_size, dim=1)[rank])]
        pairs += [(f"{n} grad", g, dict(ref.named_parameters())[n].grad)
                  for n, g in res["grads"].items()]
        for what, got, want in pairs:
            torch.testing.assert_close(got, want,
                                       msg=lambda m, r=rank, w=what: f"rank {r}, {w}: {m}")
            worst = max(worst, (got - want).abs().max().item())
    return worst


def run_ulysses_check(world_size=2, **sizes):
    """Validate (before any process starts), run on ``world_size`` ranks, assert equal to one
    process; returns the largest difference and rank 0's counts."""
    kw = {**SIZES, **sizes}
    validate_ulysses_config(kw["num_heads"], world_size, kw["seq"])
    args = (kw["batch"], kw["seq"], kw["hidden"], kw["num_heads"], kw["seed"])
    results = launch(ulysses_attention, *args, world_size=world_size,
                     warn_oversubscription=False)   # untimed: a correctness check
    worst = assert_matches_reference(results, *args)
    assert all(r["bytes"] == results[0]["bytes"] for r in results), "ranks sent different bytes"
    return {"max_abs_diff": worst, **{k: results[0][k] for k in ("bytes", "calls")}}


def traffic_rows(world_sizes, seq=48, batch=2, hidden=48, bytes_per_element=8, counted=None):
    """Per rank and layer forward: Ulysses' bytes (counted where given, and its formula) and
    ring attention's K/V bytes (formula only: the ring part measures its own)."""
    counted = counted or {}
    return [{"N": n, "ulysses_counted": counted.get(n),
             "ulysses_formula": ulysses_bytes(seq, batch, hidden, n, bytes_per_element,
                                              "forward"),
             "ring_formula": ring_kv_bytes(seq, batch, hidden, n, bytes_per_element, "forward")}
            for n in world_sizes]
