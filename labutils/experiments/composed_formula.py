"""What each mesh dimension of 06e_composed_parallelism's composed step should carry, from the
layout and the model alone (no process): the closed-form calls and payload bytes of one rank
(``formula_per_dim``, counted against in ``composed_runs.counts_table``) and the planner's
figure for the same rank (``planner_wire_bytes``, from ``cost.step_time``)."""
from __future__ import annotations

from labutils.cost.long_context import ring_attention_time
from labutils.cost.step_time import data_parallel_step, pipeline_step, tensor_parallel_step
from labutils.parallel.composed import gpt_config
from labutils.parallel.model_parallel import split_sizes


def _stage(dims, pp_rank, batch, n_microbatches, model_kwargs, dtype_bytes):
    """(bytes of one micro-batch's activation, neighbouring stages, Megatron layers) of a
    rank of stage ``pp_rank``."""
    c = gpt_config(model_kwargs)
    activation = (batch // (dims.dp * n_microbatches) * c["seq_len"] // dims.cp * c["hidden"]
                  * dtype_bytes)                                  # (B/(dp m), T/cp, H)
    neighbours = (pp_rank > 0) + (pp_rank < dims.pp - 1)
    sizes = split_sizes(c["n_layers"] + 2, dims.pp)
    first = sum(sizes[:pp_rank])
    tp_layers = sum(1 <= i <= c["n_layers"] for i in range(first, first + sizes[pp_rank]))
    return activation, neighbours, tp_layers


def stage_param_numels(dims, model_kwargs=None):
    """{pp stage: [numel of each parameter tensor one rank of it holds]}, in closed form."""
    c = gpt_config(model_kwargs)
    V, T, H, t = c["vocab_size"], c["seq_len"], c["hidden"], dims.tp
    embedding, head = [V * H, T * H], [H * V, V]
    # qkv w, qkv b, proj w, proj b (replicated), fc1 w, fc1 b, fc2 w, fc2 b (replicated)
    layer = [3 * H * H // t, 3 * H // t, H * H // t, H, 4 * H * H // t, 4 * H // t,
             4 * H * H // t, H]
    layers = [embedding] + [layer] * c["n_layers"] + [head]
    out, start = {}, 0
    for s, size in enumerate(split_sizes(len(layers), dims.pp)):
        out[s] = [n for part in layers[start:start + size] for n in part]
        start += size
    return out


def formula_per_dim(dims, pp_rank, batch=8, n_microbatches=2, model_kwargs=None,
                    dtype_bytes=8):
    """Calls and payload bytes one rank of pipeline stage ``pp_rank`` hands to each dimension's
    communication in one step (sends and receives both counted):

    * pp: per micro-batch, one activation (B/(dp m), T, H) each way per neighbouring stage:
      forward's send or receive, and its gradient back (``step_time.pipeline_step``'s 2 messages);
    * tp: 4 all-reduces of that activation per Megatron layer and micro-batch, 2 forward (g), 2
      backward (f) (``step_time.tensor_parallel_step``'s 4 per layer);
    * dp: one all-reduce per parameter tensor, of its gradient (``naive_allreduce_grads``), plus
      one all-reduce of a vector of flags, one per tensor, saying whether it got one; none when
      dp = 1. (DDP would bucket these into a few calls.) With cp > 1 the same, on the dp x cp
      group ("dp_cp"), and the activations above hold T/cp tokens;
    * cp: per Megatron layer and micro-batch, the ring (``ring_attention``) shifts a block of
      K and V, (B/(dp m), T/cp, H/tp) each, cp - 1 times forward, cp - 1 times backward, and
      the dK/dV accumulator cp times backward: 3 cp - 2 shifts, each one send and one receive.

    Payload bytes: what each call hands over. A ring all-reduce of n ranks puts 2(n-1)/n times
    that on each rank's link (equal when n = 2); a send or receive, the payload itself.
    """
    m = n_microbatches
    activation, neighbours, tp_layers = _stage(dims, pp_rank, batch, m, model_kwargs,
                                               dtype_bytes)
    tp_calls = 4 * tp_layers * m if dims.tp > 1 else 0
    numels = stage_param_numels(dims, model_kwargs)[pp_rank]
    averaged = dims.dp * dims.cp > 1
    dp_calls = len(numels) + 1 if averaged else 0
    dp_bytes = (sum(numels) + len(numels)) * dtype_bytes if averaged else 0
    out = {"pp": {"calls": 2 * m * neighbours, "bytes": 2 * m * neighbours * activation},
           "dp": {"calls": dp_calls, "bytes": dp_bytes},
           "tp": {"calls": tp_calls, "bytes": tp_calls * activation}}
    if dims.cp > 1:
        block = 2 * activation // dims.tp                        # K and V of this rank's heads
        cp_calls = 2 * (3 * dims.cp - 2) * tp_layers * m
        out["dp_cp"] = out.pop("dp")
        out["cp"] = {"calls": cp_calls, "bytes": cp_calls * block}
    return out


def planner_wire_bytes(dims, pp_rank, batch=8, n_microbatches=2, model_kwargs=None,
                       dtype_bytes=8):
    """The planner's view of the same rank (``cost.step_time``), per dimension: the
    communication seconds of ``pipeline_step`` (2 messages per micro-batch and boundary),
    ``tensor_parallel_step`` (4 all-reduces per layer, here per layer and micro-batch) and
    ``data_parallel_step`` (one ring all-reduce of the stage's gradient bytes; with cp > 1 over
    dp x cp ranks) and, with cp > 1, ``long_context.ring_attention_time`` (the ring's sends,
    per layer and micro-batch) on a link of zero latency and 1 s per byte: seconds that read
    as bytes sent on each rank's link. It has no flag all-reduce and no per-tensor calls, and
    counts a point-to-point message once (the sender's), the pipeline's both ways."""
    m, link = n_microbatches, (0.0, 1.0)
    activation, neighbours, tp_layers = _stage(dims, pp_rank, batch, m, model_kwargs,
                                               dtype_bytes)
    grad_bytes = sum(stage_param_numels(dims, model_kwargs)[pp_rank]) * dtype_bytes
    pp = neighbours * pipeline_step(0.0, dims.pp, m, activation, link).comm
    tp = tensor_parallel_step(0.0, dims.tp, tp_layers * m, activation, link).comm
    dp = data_parallel_step(0.0, grad_bytes, dims.dp * dims.cp, link).comm
    if dims.cp == 1:
        return {"pp": round(pp), "dp": round(dp), "tp": round(tp)}
    c = gpt_config(model_kwargs)
    ring, _ = ring_attention_time(c["seq_len"], batch // (dims.dp * m), c["hidden"] // dims.tp,
                                  dims.cp, 0.0, 1.0, 1.0, bytes_per_element=dtype_bytes)
    return {"pp": round(pp), "dp_cp": round(dp), "cp": round(tp_layers * m * ring),
            "tp": round(tp)}
