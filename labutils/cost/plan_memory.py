"""The planner's memory model: the parameters each pipeline rank holds and the activations one
layer keeps for backward (Korthikanti et al. 2022, generalised to any FFN width, KV heads and
mixtures of experts). ``labutils.cost.planner`` (07, 06c1) and ``labutils.cost.long_context``
(06d: what sequence parallelism saves) build on it; the planner re-exports these names.
"""
from __future__ import annotations

from labutils.cost.planspec import recompute_mode, zero_state_bytes


def stage_expert_params(model, layout, stages):
    """Expert parameters on each pipeline rank: its layers' experts, split over TP and EP."""
    return [n * model.expert_params / (layout.tp * layout.expert_parallel) for n in stages]


def stage_params(model, layout, stages):
    """Parameters held by each pipeline rank (one TP shard): its layers (experts also split
    over EP ranks); the embeddings on the first; the final LayerNorm and the output matrix (or,
    with pp > 1, a tied copy) on the last."""
    t, last = layout.tp, len(stages) - 1
    out = []
    for i, (n, experts) in enumerate(zip(stages, stage_expert_params(model, layout, stages))):
        p = n * (model.layer_params - model.expert_params) / t + experts
        if i == 0:
            p += model.embedding_params / t
        if i == last:
            p += 2 * model.hidden
            if not model.tied_embeddings or last > 0:
                p += model.vocab * model.hidden / t
        out.append(p)
    return out


def layer_activation_bytes(model, layout, mode, bytes_per_value=2):
    """Bytes one layer keeps for backward per micro-batch (Korthikanti et al. 2022, Table 2,
    with any FFN width ``f`` and KV width ``kv``): 10sbh outside the tensor-parallel region
    (LayerNorm, attention and MLP inputs, two dropout masks: split t ways only with sequence
    parallelism), 4sbh + 4sb kv + 4sbf (6sbf gated; x top_k for a mixture of experts, each
    token passing through k experts) inside it, and 5 a s^2 b of attention scores (dropped by
    selective recomputation, and never stored with ``layout.flash_attention``). Full
    recomputation keeps only the input."""
    t, sp = layout.tp, layout.sequence_parallel and layout.tp > 1
    s_local, s = model.seq_len // layout.context_parallel, model.seq_len
    b, h, a = layout.micro_batch, model.hidden, model.num_heads
    if mode == "full":
        return bytes_per_value * s_local * b * h / (t if sp else 1)
    # 10sbh: two LayerNorm inputs (4), the QKV and MLP inputs (4), two dropout masks (2)
    drop = getattr(model, "dropout", True)
    outside = (10 if drop else 8) * s_local * b * h / (t if sp else 1)
    mlp = (6 if model.gated_mlp else 4) * model.ffn
    if model.num_experts > 1:
        mlp *= model.top_k
    inside = (4 * h + 4 * model.kv_hidden + mlp) * s_local * b / t
    flash = getattr(layout, "flash_attention", False)
    # softmax output (2 bytes), and with dropout its mask (1) and output (2)
    scores = (5 if drop else 2) * a * s_local * s * b / t if mode == "none" and not flash else 0
    return outside + inside + scores


def memory_per_stage(model, layout, mode, stages, m, bytes_per_value=2):
    """Bytes on each pipeline rank: model states (ZeRO over dp x context_parallel; experts'
    over that group / expert_parallel; bf16 weights, ``layout.grad_bytes`` per gradient, 12
    bytes of fp32 master weights and Adam moments) plus the activations of the micro-batches
    it holds. A model without dropout (``model.dropout=False``) stores none of its masks."""
    L = layout
    sp = L.sequence_parallel and L.tp > 1
    s_local, b, h = model.seq_len // L.context_parallel, L.micro_batch, model.hidden
    per_layer = layer_activation_bytes(model, layout, mode, bytes_per_value)
    # what recomputation re-materialises for the layer in backward: all of it ("full"), or
    # only its attention scores ("selective")
    full_layer = layer_activation_bytes(model, layout, "none")
    working = {"none": 0.0, "full": full_layer,
               "selective": full_layer - layer_activation_bytes(model, layout, "selective")}[mode]
    p, v = L.pp, L.virtual_stages
    group = L.dp * L.context_parallel
    out = []
    for i, (n, params, experts) in enumerate(zip(stages, stage_params(model, layout, stages),
                                                 stage_expert_params(model, layout, stages))):
        # 1F1B: rank i holds p - i micro-batches. Interleaved (Megatron-LM): it runs
        # 2 (p - i - 1) + (v - 1) p warm-up forwards of one chunk (1/v of its layers) before its
        # first backward, all m v of them if there are no more, and holds one more
        in_flight = (min(p - i, m) if v == 1
                     else min(m * v, 2 * (p - i - 1) + (v - 1) * p + 1) / v)
        acts = n * per_layer * in_flight + working
        if i == 0 and getattr(model, "dropout", True):   # the embedding's dropout mask
            acts += s_local * b * h / (L.tp if sp else 1) * in_flight
        if i == L.pp - 1:   # fp32 logits for the loss, vocabulary split over TP ranks
            acts += 4 * s_local * b * model.vocab / L.tp
        g = L.grad_bytes
        states = zero_state_bytes(params - experts, group, L.zero, 2, g, 12)
        if experts:
            states += zero_state_bytes(experts, group // L.expert_parallel, L.zero, 2, g, 12)
        out.append(states + acts)
    return out


def memory_per_gpu(model, layout, recompute=True, bytes_per_value=2, batch_size=None):
    """Bytes on the busiest GPU: model states (ZeRO over dp x context_parallel) plus
    activations. ``batch_size`` (default: enough micro-batches to fill the pipeline) sets how
    many micro-batches a rank can hold."""
    stages = layout.layers_per_stage(model.num_layers)
    m = layout.pp if batch_size is None else batch_size // (layout.dp * layout.micro_batch)
    return max(memory_per_stage(model, layout, recompute_mode(recompute), stages, max(m, 1),
                                bytes_per_value))
