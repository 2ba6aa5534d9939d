"""Sequence parallelism checked (06d1): a pre-LN transformer layer with dropout, split over t
ranks by tensor parallelism alone (06b) and by tensor + sequence parallelism, run on real ranks
against one process (outputs and every gradient), with every collective call counted per phase
at PyTorch's dispatcher (``core.commcount``: the buffer each call was handed); the ring model's
bytes sent per rank derived from those payloads; a training step of each timed, TP+SP also in
Megatron's (s, b, h) layout (``seq_first``)."""
from __future__ import annotations

import torch

from labutils.core.commcount import count_collectives
from labutils.core.launcher import launch
from labutils.core.timing import Stats, interleaved, slowest_rank
from labutils.cost.costmodel import collective_time
from labutils.parallel.sequence_parallel import (
    PreLNTransformerLayer,
    SequenceParallelTransformerLayer,
    allreduce_replicated_grads,
    validate_sp_config,
)
from labutils.parallel.tensor_parallel import TPLayout, reference_shards

SIZES = {"batch": 2, "seq": 48, "hidden": 48, "num_heads": 12, "dropout": 0.1, "seed": 0}


def reference_and_inputs(batch, seq, hidden, num_heads, dropout, seed, dtype=torch.float64):
    """The seeded reference layer (LayerNorm weights away from 1 and 0, so a wrong shard of
    their gradient shows), an input and an upstream gradient: the same on every rank."""
    torch.manual_seed(seed)
    ref = PreLNTransformerLayer(hidden, num_heads, dropout, seed).to(dtype)
    with torch.no_grad():
        for ln in (ref.ln1, ref.ln2):
            ln.weight.normal_(1.0, 0.2)
            ln.bias.normal_(0.0, 0.2)
    x = torch.randn(batch, seq, hidden, dtype=dtype)
    dy = torch.randn(batch, seq, hidden, dtype=dtype)
    return ref, x, dy


def my_shard(tensor, rank, world_size, sequence_parallel):
    """This rank's sequence shard (SP), or the whole tensor (TP alone); a copy, so that it owns
    a storage of its own size (a view would count as the whole tensor in the memory count)."""
    return (tensor.chunk(world_size, dim=1)[rank] if sequence_parallel else tensor).clone()


# bytes a call hands back, from the bytes it was handed and the group's size t: an all-reduce
# returns its buffer, an all-gather t shards, a reduce-scatter one shard of t
_HANDED_BACK = {"allreduce_": lambda n, t: n, "allgather_": lambda n, t: n * t,
                "reduce_scatter_": lambda n, t: n // t,
                # the single-tensor calls of the (s, b, h) layout
                "_allgather_base_": lambda n, t: n * t,
                "_reduce_scatter_base_": lambda n, t: n // t}


def _calls(counted):
    """The collective calls of one phase, in order: (op, bytes handed in, bytes handed back)."""
    return [(c.op, c.nbytes, _HANDED_BACK[c.op](c.nbytes, c.group_size)) for c in counted.calls]


def _to_layout(t, seq_first):
    """(B, T, H) -> (T, B, H), contiguous, for the seq_first layout; else unchanged."""
    return t.transpose(0, 1).contiguous() if seq_first else t


def sp_layer(rank, world_size, sequence_parallel=True, batch=2, seq=48, hidden=48, num_heads=12,
             dropout=0.1, seed=0, regather=False, seq_first=False):
    """Worker: one forward and backward of the split layer (``regather``: Megatron's re-gather;
    ``seq_first``: (s, b, h) activations); its output and input gradient (as (b, s, h)),
    parameter gradients, and the collectives it issued by phase (counted at the dispatcher)."""
    ref, x, dy = reference_and_inputs(batch, seq, hidden, num_heads, dropout, seed)
    layout = TPLayout(rank, world_size)
    layer = SequenceParallelTransformerLayer(ref, layout, sequence_parallel, regather, seq_first)
    x = _to_layout(my_shard(x, rank, world_size, sequence_parallel), seq_first).requires_grad_()
    dy = _to_layout(my_shard(dy, rank, world_size, sequence_parallel), seq_first)
    dispatched = {}
    with count_collectives() as dispatched["forward"]:
        y = layer(x)
    with count_collectives() as dispatched["backward"]:
        (y * dy).sum().backward()
    with count_collectives() as dispatched["grads"]:
        allreduce_replicated_grads(layer, layout)
    phases = ("forward", "backward", "grads")
    back = (lambda t: t.transpose(0, 1)) if seq_first else (lambda t: t)
    return {"output": back(y.detach()), "input_grad": back(x.grad),
            "grads": {n: p.grad for n, p in layer.named_parameters()},
            "calls": {ph: _calls(dispatched[ph]) for ph in phases}}


def assert_matches_reference(results, sequence_parallel, batch, seq, hidden, num_heads,
                             dropout, seed):
    """Every rank's output, input gradient and parameter-gradient slice equal the single-process
    layer's (float64, ``assert_close``'s default tolerances); returns the largest difference."""
    ref, x, dy = reference_and_inputs(batch, seq, hidden, num_heads, dropout, seed)
    x = x.clone().requires_grad_()
    y = ref(x)
    (y * dy).sum().backward()
    grads = {n: p.grad for n, p in ref.named_parameters()}
    world_size, worst = len(results), 0.0
    for rank, res in enumerate(results):
        # every reference parameter is compared: one missing from the parallel layer would fail
        assert set(res["grads"]) == set(grads), (
            f"rank {rank}: parameters {sorted(set(res['grads']) ^ set(grads))} not in both layers")
        layout = TPLayout(rank, world_size)
        pairs = [("output", res["output"], my_shard(y.detach(), rank, world_size,
                                                     sequence_parallel)),
                 ("input grad", res["input_grad"], my_shard(x.grad, rank, world_size,
                                                             sequence_parallel))]
        for name, g in res["grads"].items():   # LayerNorms are replicated, like row biases
            want = grads[name] if name.startswith("ln") else reference_shards(name, grads[name],
                                                                              layout)
            pairs.append((f"{name} grad", g, want))
        for what, got, want in pairs:
            torch.testing.assert_close(got, want,
                                       msg=lambda m, r=rank, w=what: f"rank {r}, {w}: {m}")
            worst = max(worst, (got - want).abs().max().item())
    return worst


def run_sp_check(tp_world_size=2, sequence_parallel=True, regather=False, seq_first=False,
                 **sizes):
    """Validate, run ``sp_layer`` on ``tp_world_size`` ranks, assert it equals one process.
    Returns the largest difference, rank 0's collectives by phase and the number of parameter
    gradients compared (asserted to be every parameter of the reference)."""
    kw = {**SIZES, **sizes}
    validate_sp_config(kw["hidden"], kw["num_heads"], kw["seq"], tp_world_size)
    args = (sequence_parallel, kw["batch"], kw["seq"], kw["hidden"], kw["num_heads"],
            kw["dropout"], kw["seed"])
    results = launch(sp_layer, *args, world_size=tp_world_size, regather=regather,
                     seq_first=seq_first, warn_oversubscription=False)   # untimed
    worst = assert_matches_reference(results, *args)
    assert all(r["calls"] == results[0]["calls"] for r in results), "ranks' calls differ"
    return {"max_abs_diff": worst, "calls": results[0]["calls"],
            "grads_checked": len(results[0]["grads"])}


# the dispatcher's op names -> the cost layer's collectives
_MODEL_OP = {"allreduce_": "allreduce", "reduce_scatter_": "reduce_scatter",
             "allgather_": "all_gather", "_reduce_scatter_base_": "reduce_scatter",
             "_allgather_base_": "all_gather"}


def ring_model_bytes(op, given, back, world_size):
    """Bytes one rank sends in ``op`` on a ring, DERIVED from the counted payloads with the cost
    layer's ring model (``costmodel``: an all-reduce sends 2(t-1)/t of its buffer, a
    reduce-scatter or all-gather (t-1)/t of the whole, unsharded buffer). A model, not a
    measurement: gloo picks its own algorithms."""
    return round(collective_time(_MODEL_OP[op], max(given, back), world_size, 0.0, 1.0, "ring"))


def comm_table(result, world_size):
    """Rows (phase, op, calls, bytes handed in per call, bytes handed back per call, ring-model
    bytes sent per rank for those calls) of one ``run_sp_check`` result; calls of one op with
    different payloads get a row each."""
    rows = []
    for phase, calls in result["calls"].items():
        for key in dict.fromkeys(calls):
            n = calls.count(key)
            rows.append((phase, key[0], n, key[1], key[2],
                         n * ring_model_bytes(*key, world_size)))
    return rows


def time_steps(rank, world_size, repeats=7, batch=2, seq=48, hidden=48, num_heads=12,
               dropout=0.1, seed=0):
    """Worker: forward + backward (+ the replicated-gradient sum) of TP alone, of TP+SP and of
    TP+SP in the (s, b, h) layout, float32, interleaved; each sample is the slowest rank's (a
    step ends when all have)."""
    ref, x, dy = reference_and_inputs(batch, seq, hidden, num_heads, dropout, seed,
                                      torch.float32)
    steps = {}
    for name, sp, seq_first in (("TP", False, False), ("TP+SP", True, False),
                                ("TP+SP (s, b, h)", True, True)):
        layer = SequenceParallelTransformerLayer(ref, TPLayout(rank, world_size), sp,
                                                 seq_first=seq_first)
        xs, dys = (_to_layout(my_shard(t, rank, world_size, sp), seq_first) for t in (x, dy))

        def step(layer=layer, xs=xs, dys=dys):
            (layer(xs) * dys).sum().backward()
            allreduce_replicated_grads(layer, layer.layout)
        steps[name] = step
    stats = interleaved(steps, repeats=repeats)
    return {name: Stats.of(slowest_rank(list(st.values)), st.rounds)   # still paired
            for name, st in stats.items()}

