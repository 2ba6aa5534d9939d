"""Tensor parallelism checked (06b): the Megatron MLP and attention blocks, and a transformer
layer made of both, run on real ranks against one process (outputs and every gradient shard),
and the same MLP through PyTorch's ``torch.distributed.tensor.parallel``. Each run also counts,
at the dispatcher, the bytes the same block's data-parallel step hands to its gradient
all-reduce (PyTorch's DDP, each rank 1/p of the batch), so TP's bytes are set against DP's
counted on the same ranks."""
from __future__ import annotations

import copy

import torch
from torch.nn.parallel import DistributedDataParallel

from labutils.core.commcount import count_collectives
from labutils.core.launcher import launch
from labutils.parallel.tensor_parallel import (
    MLP,
    ParallelMLP,
    ParallelSelfAttention,
    ParallelTransformerLayer,
    SelfAttention,
    TPLayout,
    TransformerLayer,
    reference_shards,
    validate_tp_config,
)


def _reference_and_inputs(block, batch, seq, hidden, num_heads, seed):
    torch.manual_seed(seed)  # every rank builds the same reference, input and upstream gradient
    ref = {"mlp": lambda: MLP(hidden), "attention": lambda: SelfAttention(hidden, num_heads),
           "layer": lambda: TransformerLayer(hidden, num_heads)}[block]()
    x = torch.randn(batch, seq, hidden)
    dy = torch.randn(batch, seq, hidden)  # a random upstream gradient exercises every path
    return ref, x, dy


def _forward_backward(model, x, dy):
    x = x.clone().requires_grad_()
    y = model(x)
    (y * dy).sum().backward()
    return y.detach(), x.grad, {n: p.grad for n, p in model.named_parameters()}


def _dp_gradient_bytes(rank, world_size, ref, x, dy):
    """Bytes this rank hands to all-reduces in one data-parallel backward of ``ref`` (PyTorch's
    DDP, this rank's 1/p of the batch), counted at the dispatcher; None when the batch does not
    divide by the ranks."""
    if len(x) % world_size:
        return None
    dp = DistributedDataParallel(copy.deepcopy(ref))   # broadcasts the weights: outside the count
    mine = slice(rank * len(x) // world_size, (rank + 1) * len(x) // world_size)
    y = dp(x[mine])
    with count_collectives() as backward:      # DDP's bucket all-reduces run from backward
        (y * dy[mine]).sum().backward()
    return sum(c.nbytes for c in backward.of("allreduce"))


def parallel_block(rank, world_size, block="mlp", batch=2, seq=4, hidden=16, num_heads=4,
                   seed=0):
    """Worker: build the tensor-parallel block from the seeded reference, run forward and
    backward, and count at the dispatcher (``core.commcount``) the collectives each phase issued
    and the bytes handed to them; then the same block data-parallel (``dp_bytes``)."""
    ref, x, dy = _reference_and_inputs(block, batch, seq, hidden, num_heads, seed)
    layout = TPLayout(rank, world_size)
    par = {"mlp": ParallelMLP, "attention": ParallelSelfAttention,
           "layer": ParallelTransformerLayer}[block](ref, layout)
    x = x.clone().requires_grad_()
    with count_collectives() as forward:
        y = par(x)
    with count_collectives() as backward:
        (y * dy).sum().backward()
    return {"output": y.detach(), "input_grad": x.grad,
            "grads": {n: p.grad for n, p in par.named_parameters()},
            "forward_bytes": sum(c.nbytes for c in forward.calls),
            "forward_calls": forward.total, "forward_ops": dict(forward.by_op),
            "backward_bytes": sum(c.nbytes for c in backward.calls),
            "backward_calls": backward.total, "backward_ops": dict(backward.by_op),
            "dp_bytes": _dp_gradient_bytes(rank, world_size, ref, x.detach(), dy)}


def assert_matches_reference(results, block, batch=2, seq=4, hidden=16, num_heads=4, seed=0):
    """Assert every rank's output, input gradient and parameter-gradient slice equal the
    single-process block's; return the largest absolute difference of each, over ranks."""
    ref, x, dy = _reference_and_inputs(block, batch, seq, hidden, num_heads, seed)
    y_ref, x_grad_ref, grads_ref = _forward_backward(ref, x, dy)
    world_size, max_diff = len(results), {}
    # A weight gradient sums B*T products; summed in another order (per slice) in float32 it
    # differs by rounding that grows like sqrt(B*T); a wrong split differs by O(1).
    atol = 1e-5 * max(1.0, (batch * seq) ** 0.5)

    def check(what, got, expected, rank):
        torch.testing.assert_close(got, expected, atol=atol, rtol=1e-4,
                                   msg=lambda m: f"rank {rank}, {what}: {m}")
        max_diff[what] = max(max_diff.get(what, 0.0), (got - expected).abs().max().item())

    for rank, res in enumerate(results):
        check("output", res["output"], y_ref, rank)
        check("input grad", res["input_grad"], x_grad_ref, rank)
        layout = TPLayout(rank, world_size)
        for name, grad in res["grads"].items():
            check(f"{name} grad", grad, reference_shards(name, grads_ref[name], layout), rank)
    return max_diff


def run_block_check(block="mlp", tp_world_size=2, batch=2, seq=4, hidden=16, num_heads=4,
                    seed=0):
    """Check the configuration, run ``parallel_block`` on ``tp_world_size`` ranks, assert it
    equals the single-process block. Returns max differences and bytes per rank."""
    if block not in ("mlp", "attention", "layer"):
        raise ValueError(f"block must be 'mlp', 'attention' or 'layer'; got {block!r}")
    validate_tp_config(hidden, None if block == "mlp" else num_heads, tp_world_size)
    args = (block, batch, seq, hidden, num_heads, seed)
    results = launch(parallel_block, *args, world_size=tp_world_size,
                     warn_oversubscription=False)
    max_diff = assert_matches_reference(results, *args)
    keys = ("forward_bytes", "forward_calls", "forward_ops", "backward_bytes", "backward_calls",
            "backward_ops", "dp_bytes")
    return {"max_abs_diff": max_diff, **{k: results[0][k] for k in keys},
            "param_shapes": {n: tuple(g.shape) for n, g in results[0]["grads"].items()}}


def dtensor_mlp(rank, world_size, batch=2, seq=4, hidden=16, seed=0):
    """Worker: the same MLP through PyTorch's ``parallelize_module`` on a CPU DeviceMesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    model, x, dy = _reference_and_inputs("mlp", batch, seq, hidden, None, seed)
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    with CommDebugMode() as comm:
        y, x_grad, grads = _forward_backward(model, x, dy)
    return {"output": y, "input_grad": x_grad,
            "grads": {n: g.to_local() for n, g in grads.items()},  # this rank's shard
            "full_grads": {n: g.full_tensor() for n, g in grads.items()},
            "placements": {n: str(p.placements[0]) for n, p in model.named_parameters()},
            "comm_counts": {str(k).split(".")[-1]: v
                            for k, v in comm.get_comm_counts().items()}}


def run_dtensor_check(tp_world_size=2, batch=2, seq=4, hidden=16, seed=0):
    """``parallelize_module`` (ColwiseParallel fc1, RowwiseParallel fc2) on real ranks:
    asserted equal to the single-process MLP, and its local shards to ``ParallelMLP``'s."""
    validate_tp_config(hidden, None, tp_world_size)
    results = launch(dtensor_mlp, batch, seq, hidden, seed, world_size=tp_world_size,
                     warn_oversubscription=False)
    max_diff = assert_matches_reference(results, "mlp", batch, seq, hidden, 4, seed)
    ref, x, dy = _reference_and_inputs("mlp", batch, seq, hidden, None, seed)
    _, _, grads_ref = _forward_backward(ref, x, dy)
    for res in results:
        for name, g in res["full_grads"].items():
            torch.testing.assert_close(g, grads_ref[name])
    return {"max_abs_diff": max_diff, "placements": results[0]["placements"],
            "comm_counts": results[0]["comm_counts"]}
