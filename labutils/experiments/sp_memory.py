"""Activation memory per rank with and without sequence parallelism (06d1), counted and set
against Korthikanti et al. 2022's formula (Table 2) as the planner writes it.

Counted: ``core.memory.activation_bytes``, every tensor autograd saves for backward in one
forward pass (``saved_tensors_hooks``), each storage once, parameters left out. The count is
deterministic (it depends on shapes, not on values or timing).

The formula (``cost.plan_memory.layer_activation_bytes``, "selective" mode) counts 2-byte
activations and 1-byte dropout masks: (10 + 24/t) s b h without SP, (10 + 24/t)/t s b h with
SP. Its adaptation to this float32 layer, term by term:

* every activation is 4 bytes, twice the formula's, except the two dropout masks, which stay
  1 byte (bool): 2 x formula - 2 s b h (divided by t with SP);
* the attention scores (5 a s^2 b) are not kept: ``scaled_dot_product_attention`` on CPU is a
  flash-style kernel that saves q, k, v, its output and a log-sum-exp per query and head (the
  formula's "selective" mode, which drops the scores, plus that log-sum-exp);
* with SP, each column-parallel linear keeps its all-gathered (whole-sequence) input, 4 s b h
  bytes each, where Megatron keeps the shard and all-gathers it again in backward: + 8 s b h
  (1 - 1/t). So of the paper's 10 s b h (2-byte units: 2 LayerNorm inputs 4, 2 masks 2, the
  QKV and fc1 inputs 4) this layer divides 6 by t, not 10 (``region_bytes``, ``sp_saving``);
* LayerNorm's per-position mean and 1/std (4 bytes each, 2 LayerNorms) and the log-sum-exp
  (4 a s b / t) are in the count, not in the formula (the paper neglects them).
"""
from __future__ import annotations

import torch

from labutils.core.launcher import launch
from labutils.core.memory import activation_bytes
from labutils.cost.plan_memory import layer_activation_bytes
from labutils.cost.planspec import Layout, Transformer
from labutils.experiments.sp_equivalence import SIZES, my_shard, reference_and_inputs
from labutils.parallel.sequence_parallel import (
    SequenceParallelTransformerLayer,
    validate_sp_config,
)
from labutils.parallel.tensor_parallel import TPLayout


def saved_bytes(rank, world_size, sequence_parallel=True, batch=2, seq=48, hidden=48,
                num_heads=12, dropout=0.1, seed=0, regather=False):
    """Worker: bytes this rank's float32 layer saves for backward in one forward pass."""
    ref, x, _ = reference_and_inputs(batch, seq, hidden, num_heads, dropout, seed,
                                     torch.float32)
    layer = SequenceParallelTransformerLayer(ref, TPLayout(rank, world_size), sequence_parallel,
                                             regather)
    return activation_bytes(layer, my_shard(x, rank, world_size, sequence_parallel))


def formula(tp_world_size, sequence_parallel, batch=2, seq=48, hidden=48, num_heads=12,
            regather=False, **_):
    """The planner's formula for one layer and rank, and this block's float32 adaptation
    (see the module's docstring): {"paper": 2-byte formula, "adapted": float32, "neglected":
    LayerNorm statistics + log-sum-exp, "expected": adapted + neglected}."""
    t, sbh = tp_world_size, seq * batch * hidden
    sp = sequence_parallel and t > 1
    split = t if sp else 1
    model = Transformer(num_layers=1, hidden=hidden, num_heads=num_heads, seq_len=seq)
    paper = layer_activation_bytes(model, Layout(tp=t, sequence_parallel=sp, micro_batch=batch),
                                   "selective")
    # the whole linear inputs this layer keeps, unless it re-gathers them as Megatron does
    adapted = 2 * paper - 2 * sbh / split + (8 * sbh * (1 - 1 / t) if sp and not regather else 0)
    neglected = 2 * 2 * 4 * seq * batch / split + 4 * num_heads * seq * batch / t
    return {"paper": paper, "adapted": adapted, "neglected": neglected,
            "expected": adapted + neglected}


def region_bytes(batch=2, seq=48, hidden=48, **_):
    """What the regions outside the tensor-parallel blocks keep per rank under TP alone, float32,
    by part. The first three are split by SP here; ``linear_inputs`` (the QKV and fc1 inputs,
    the LayerNorms' outputs) stays whole, as the all-gathered input autograd keeps."""
    sb = seq * batch
    return {"ln_inputs": 2 * 4 * sb * hidden, "masks": 2 * sb * hidden,  # bool: 1 byte
            "ln_stats": 2 * 2 * 4 * sb, "linear_inputs": 2 * 4 * sb * hidden}


def sp_saving(tp_world_size, regather=False, **sizes):
    """Bytes per rank SP saves against TP alone: (1 - 1/t) x the LayerNorm inputs, dropout masks
    and LayerNorm statistics; with Megatron's re-gather (``regather=True``, ``GatheredColumnLinear``) also
    (1 - 1/t) x the QKV and fc1 inputs."""
    parts = region_bytes(**sizes)
    split = ("ln_inputs", "masks", "ln_stats", *(("linear_inputs",) if regather else ()))
    return (1 - 1 / tp_world_size) * sum(parts[k] for k in split)


def run_memory(world_sizes=(2, 4), **sizes):
    """Count the saved bytes on every rank for TP alone, TP+SP and TP+SP with Megatron's
    re-gather at each size; rows with the formula beside. Asserts every rank saved the same
    bytes and matches the adapted formula exactly (the terms the paper neglects included), and
    that each SP layout saved ``sp_saving(t, regather)`` exactly."""
    kw = {**SIZES, **sizes}
    rows = []
    for t in world_sizes:
        validate_sp_config(kw["hidden"], kw["num_heads"], kw["seq"], t)
        got = {}
        for name, sp, regather in (("TP", False, False), ("TP+SP", True, False),
                                   ("TP+SP re-gather", True, True)):
            args = (sp, kw["batch"], kw["seq"], kw["hidden"], kw["num_heads"], kw["dropout"],
                    kw["seed"], regather)
            per_rank = launch(saved_bytes, *args, world_size=t,
                              warn_oversubscription=False)   # counts bytes: nothing timed
            assert len(set(per_rank)) == 1, f"ranks saved different bytes: {per_rank}"
            f = formula(t, sp, regather=regather, **kw)
            # the formula's terms are whole bytes when t divides s; round away float noise
            assert per_rank[0] == round(f["expected"]), (t, name, per_rank[0], f)
            got[name] = per_rank[0]
            rows.append({"t": t, "layout": name, "measured": per_rank[0],
                         **f, "ratio": per_rank[0] / f["adapted"]})
        for name, regather in (("TP+SP", False), ("TP+SP re-gather", True)):
            assert got["TP"] - got[name] == round(sp_saving(t, regather, **kw)), (t, got)
    return rows
