"""A scaling planner: memory and step time of transformer training layouts on many GPUs.
Used by 07_conclusion_outlook (and 06c for the ZeRO memory formula); checked against published
runs in ``labutils.cost.published``. What it plans for (``Transformer``, ``Hardware``,
``Layout``) lives in ``labutils.cost.planspec``; the names it needs are imported here.

``predict`` builds one micro-batch on the slowest pipeline rank: its arithmetic (FLOPs over
``efficiency`` x peak, and the memory-bound operations between the matmuls at the HBM's
bandwidth) plus the communication on its critical path (tensor-parallel
all-reduces, or with sequence parallelism the reduce-scatters and all-gathers that move the
same bytes; pipeline messages; the part of ring attention's K/V transfer that outlasts the
attention it hides behind). The 1F1B schedule runs m such slots plus (p-1)/v of fill and drain,
so the bubble share is (p-1)/(v m + p - 1); then the data-parallel gradient traffic that
backward does not hide is added (ZeRO-2/3 per micro-batch). Memory is the busiest pipeline
rank's model states (ZeRO) plus activations (Korthikanti et al. 2022, generalised to any FFN
width and KV heads), the first rank's embedding, the last rank's fp32 logits, and with
recomputation one layer's full working set.

Two FLOP conventions: ``Prediction.tflops_per_gpu`` counts model FLOPs (3 x the forward;
recomputation not counted, as "MFU" does); ``hardware_tflops_per_gpu`` also counts what is
recomputed (as "HFU" does, and as Narayanan et al. 2021's table did with full recomputation).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from labutils.cost import costmodel as cm
from labutils.cost.planspec import (  # noqa: F401
    A100_EFFICIENCY,
    HARDWARE,
    RECOMPUTE,
    Hardware,
    Layout,
    Transformer,
    get_hardware,
    recompute_mode,
    zero_memory_per_gpu,
)
from labutils.cost.step_time import StepTime, _overlapped


def _check_layout(model, layout, batch_size):
    L = layout
    if min(L.dp, L.tp, L.pp, L.micro_batch, L.virtual_stages, L.context_parallel) < 1:
        raise ValueError(f"dp, tp, pp, micro_batch, virtual_stages and context_parallel must "
                         f"be >= 1; got {layout}")
    if L.zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0, 1, 2 or 3; got {L.zero!r}")
    kv_heads = model.num_kv_heads or model.num_heads
    if model.num_heads % L.tp or kv_heads % L.tp:
        raise ValueError(f"tp={L.tp} must divide num_heads={model.num_heads} and "
                         f"num_kv_heads={kv_heads}")
    if L.pp > model.num_layers:
        raise ValueError(f"pp={L.pp} stages for {model.num_layers} layers: use pp <= num_layers")
    stages = L.layers_per_stage(model.num_layers)
    if len(stages) != L.pp or sum(stages) != model.num_layers or min(stages) < 1:
        raise ValueError(f"stage_layers={stages} must give pp={L.pp} positive layer counts "
                         f"summing to num_layers={model.num_layers}")
    if L.virtual_stages > 1 and (L.pp == 1 or any(n % L.virtual_stages for n in stages)):
        raise ValueError(f"virtual_stages={L.virtual_stages} needs pp > 1 and each stage's "
                         f"layers {stages} divisible by it")
    if model.seq_len % L.context_parallel:
        raise ValueError(f"context_parallel={L.context_parallel} must divide "
                         f"seq_len={model.seq_len}")
    if batch_size % (L.dp * L.micro_batch):
        raise ValueError(f"batch_size={batch_size} must be a multiple of dp x micro_batch = "
                         f"{L.dp * L.micro_batch}")
    m = batch_size // (L.dp * L.micro_batch)
    if L.virtual_stages > 1 and m % L.pp:
        raise ValueError(f"the interleaved schedule needs the micro-batches per pipeline "
                         f"({m}) to be a multiple of pp={L.pp}")
    return stages, m


def _stage_params(model, layout, stages):
    """Parameters held by each pipeline rank (one TP shard): its layers; the embeddings on the
    first; the final LayerNorm and the output matrix (or, with pp > 1, a tied copy) on the last."""
    t, last = layout.tp, len(stages) - 1
    out = []
    for i, n in enumerate(stages):
        p = n * model.layer_params / t
        if i == 0:
            p += model.embedding_params / t
        if i == last:
            p += 2 * model.hidden
            if not model.tied_embeddings or last > 0:
                p += model.vocab * model.hidden / t
        out.append(p)
    return out


def _layer_activation_bytes(model, layout, mode, bytes_per_value=2):
    """Bytes one layer keeps for backward per micro-batch (Korthikanti et al. 2022, Table 2,
    with any FFN width ``f`` and KV width ``kv``): 10sbh outside the tensor-parallel region
    (LayerNorm, attention and MLP inputs, two dropout masks: split t ways only with sequence
    parallelism), 4sbh + 4sb kv + 4sbf (6sbf gated) inside it, and 5 a s^2 b of attention
    scores (dropped by selective recomputation). Full recomputation keeps only the input."""
    t, sp = layout.tp, layout.sequence_parallel and layout.tp > 1
    s_local, s = model.seq_len // layout.context_parallel, model.seq_len
    b, h, a = layout.micro_batch, model.hidden, model.num_heads
    if mode == "full":
        return bytes_per_value * s_local * b * h / (t if sp else 1)
    outside = 10 * s_local * b * h / (t if sp else 1)
    inside = (4 * h + 4 * model.kv_hidden + (6 if model.gated_mlp else 4) * model.ffn) \
        * s_local * b / t
    scores = 5 * a * s_local * s * b / t if mode == "none" else 0
    return outside + inside + scores


def _memory_per_stage(model, layout, mode, stages, m, bytes_per_value=2):
    L = layout
    sp = L.sequence_parallel and L.tp > 1
    s_local, b, h = model.seq_len // L.context_parallel, L.micro_batch, model.hidden
    per_layer = _layer_activation_bytes(model, layout, mode, bytes_per_value)
    # what recomputation re-materialises for the layer in backward: all of it ("full"), or
    # only its attention scores ("selective")
    full_layer = _layer_activation_bytes(model, layout, "none")
    working = {"none": 0.0, "full": full_layer,
               "selective": full_layer - _layer_activation_bytes(model, layout, "selective")}[mode]
    interleave = 1 + (L.pp - 1) / (L.pp * L.virtual_stages) if L.virtual_stages > 1 else 1.0
    out = []
    for i, (n, params) in enumerate(zip(stages, _stage_params(model, layout, stages))):
        in_flight = min(L.pp - i, m) * interleave       # 1F1B: rank i holds p - i micro-batches
        acts = n * per_layer * in_flight + working
        if i == 0:   # the embedding's dropout mask, for each micro-batch in flight
            acts += s_local * b * h / (L.tp if sp else 1) * in_flight
        if i == L.pp - 1:   # fp32 logits for the loss, vocabulary split over TP ranks
            acts += 4 * s_local * b * model.vocab / L.tp
        out.append(zero_memory_per_gpu(params, L.dp * L.context_parallel, L.zero) + acts)
    return out


def memory_per_gpu(model, layout, recompute=True, bytes_per_value=2, batch_size=None):
    """Bytes on the busiest GPU: model states (ZeRO over dp x context_parallel) plus
    activations. ``batch_size`` (default: enough micro-batches to fill the pipeline) sets how
    many micro-batches a rank can hold."""
    stages = layout.layers_per_stage(model.num_layers)
    m = layout.pp if batch_size is None else batch_size // (layout.dp * layout.micro_batch)
    return max(_memory_per_stage(model, layout, recompute_mode(recompute), stages, max(m, 1),
                                 bytes_per_value))


@dataclass(frozen=True)
class Prediction:
    layout: Layout
    step: StepTime
    flops_per_gpu: float            # model FLOP/s per GPU (recomputation not counted)
    memory: float                   # bytes on the busiest GPU
    hardware_flops_per_gpu: float = 0.0   # recomputed FLOPs counted too
    recompute: str = "full"
    bubble_fraction: float = 0.0    # idle share of the pipeline: (p-1)/(v m + p - 1)
    terms: dict = field(default_factory=dict, compare=False)   # seconds per step, by cause

    @property
    def tflops_per_gpu(self):
        return self.flops_per_gpu / 1e12

    @property
    def hardware_tflops_per_gpu(self):
        return self.hardware_flops_per_gpu / 1e12


def _dp_network(hw, model_parallel_size):
    """The network as one data-parallel group sees it: the ``g`` GPUs of a group that share a
    node send through ``g`` adapters at once (NCCL runs one ring per adapter), while the
    node's other GPUs serve the other groups; so the group's ring gets g adapters' bandwidth."""
    g = max(1, hw.gpus_per_node // model_parallel_size)
    return cm.Link(f"{hw.inter.name} x{g}", min(hw.inter.bandwidth * g, hw.intra.bandwidth),
                   hw.inter.latency)


def _link(hw, span):
    """The intra-node link for a group spanning at most one node's GPUs, else the network."""
    return hw.intra if span <= hw.gpus_per_node else hw.inter


def _dp_comm(grad_params, group, zero, m, link):
    """Seconds of data-parallel traffic per step: one all-reduce of the gradients (ZeRO 0/1);
    ZeRO-2 reduce-scatters each micro-batch's gradients and gathers the weights once; ZeRO-3
    also gathers the weights for each micro-batch's forward and again for its backward."""
    if group == 1:
        return 0.0
    n, ab = 2 * grad_params, (link.alpha, link.beta)
    if zero <= 1:
        return cm.allreduce_time(n, group, *ab)
    rs, ag = cm.reduce_scatter_time(n, group, *ab), cm.all_gather_time(n, group, *ab)
    return m * rs + ag if zero == 2 else m * (rs + 2 * ag)


def predict(model, layout, batch_size, hardware, efficiency=None, recompute=True, dp_overlap=0.0):
    """Predicted step time, per-GPU FLOP/s and memory of ``layout`` on ``hardware``.
    ``efficiency`` defaults to the hardware's documented value; ``recompute`` is True
    ("full"), False ("none") or "selective"."""
    hw, mode = get_hardware(hardware), recompute_mode(recompute)
    eff = hw.efficiency if efficiency is None else efficiency
    if eff is None or not 0 < eff <= 1:
        raise ValueError(f"efficiency must be in (0, 1] (or set on the Hardware); got {eff!r}")
    stages, m = _check_layout(model, layout, batch_size)
    L, speed = layout, hw.peak_flops * eff
    tp, pp, cp, v = L.tp, L.pp, L.context_parallel, L.virtual_stages
    tokens = L.micro_batch * model.seq_len // cp            # this rank's tokens per micro-batch
    layer_fwd, attn_fwd = model.layer_flops(tokens) / tp, model.attention_flops(tokens) / tp
    layer = ((4 if mode == "full" else 3) * layer_fwd
             + (attn_fwd if mode == "selective" else 0)) / speed
    logits = 3 * model.logits_flops(tokens) / tp / speed
    # the memory-bound work between the matmuls (LayerNorm, softmax, GeLU, dropout, residual
    # adds): each activation byte a layer stores is written and read in the forward pass, read
    # with its gradient coming in and going out in backward: about 5 bytes of HBM traffic
    # (an estimate from that count, not a fit); a full recomputation repeats the forward's 2
    traffic = (5 + (2 if mode == "full" else 0)) * _layer_activation_bytes(model, layout, "none")
    elementwise = traffic / hw.hbm_bandwidth
    layer += elementwise
    act = 2 * tokens * model.hidden                          # bf16 activations, bytes
    link = _link(hw, tp)
    tp_comm = ((6 if mode == "full" else 4) * cm.allreduce_time(act, tp, link.alpha, link.beta)
               if tp > 1 else 0.0)
    cp_comm = cp_exposed = 0.0
    if cp > 1:   # K and V blocks: cp-1 hops forward, K/V and their gradients back in backward
        link = _link(hw, tp * cp)
        hops = (cp - 1) * (4 if mode == "full" else 3)
        cp_comm = hops * cm.send_recv_time(4 * tokens * model.kv_hidden / tp, 2, link.alpha,
                                           link.beta)
        cp_exposed = max(0.0, cp_comm - (4 if mode == "full" else 3) * attn_fwd / speed)
    work = [n * layer + (logits if i == pp - 1 else 0.0) for i, n in enumerate(stages)]
    slow = max(range(pp), key=lambda i: work[i] + stages[i] * (tp_comm + cp_exposed))
    link = _link(hw, tp * cp * pp)
    pp_comm = (2 * v * cm.send_recv_time(act / tp, 2, link.alpha, link.beta) if pp > 1 else 0.0)
    slot_comm = stages[slow] * (tp_comm + cp_exposed) + pp_comm
    slot = work[slow] + slot_comm
    bubble = (pp - 1) * slot / v
    n_gpus = L.world_size
    dp_link = hw.intra if n_gpus <= hw.gpus_per_node else _dp_network(hw, tp * pp)
    dp_comm = _dp_comm(max(_stage_params(model, layout, stages)), L.dp * cp, L.zero, m, dp_link)
    dp_exposed = _overlapped(m * work[slow], dp_comm, dp_overlap)
    step = StepTime(m * work[slow], m * (stages[slow] * (tp_comm + cp_comm) + pp_comm)
                       + dp_comm, m * slot_comm + dp_exposed, bubble)
    terms = {"compute": m * (work[slow] - stages[slow] * elementwise),
             "memory-bound ops": m * stages[slow] * elementwise, "bubble": bubble,
             "tensor parallel": m * stages[slow] * tp_comm,
             "context parallel": m * stages[slow] * cp_exposed,
             "pipeline messages": m * pp_comm, "data parallel": dp_exposed}
    return Prediction(
        layout, step, model.iteration_flops(batch_size, "none") / (n_gpus * step.total),
        max(_memory_per_stage(model, layout, mode, stages, m)),
        model.iteration_flops(batch_size, mode) / (n_gpus * step.total), mode,
        bubble / (m * slot + bubble), terms)


def calibrate(model, layout, batch_size, hardware, measured_flops_per_gpu, convention="model",
              **kwargs):
    """The ``efficiency`` at which ``predict`` gives the measured per-GPU FLOP/s, counted as
    ``convention`` says ("model", or "hardware" with recomputation counted). Bisection:
    throughput rises monotonically with efficiency."""
    if convention not in ("model", "hardware"):
        raise ValueError(f"convention must be 'model' or 'hardware'; got {convention!r}")
    attr = "flops_per_gpu" if convention == "model" else "hardware_flops_per_gpu"

    def rate(eff):
        return getattr(predict(model, layout, batch_size, hardware, eff, **kwargs), attr)
    lo, hi = 1e-4, 1.0
    if rate(hi) < measured_flops_per_gpu:
        raise ValueError("the measured throughput exceeds what the model allows at 100% of "
                         "peak; check the hardware's peak, the FLOP count and its convention")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rate(mid) < measured_flops_per_gpu else (lo, mid)
    return (lo + hi) / 2


def search(model, num_gpus, batch_size, hardware, efficiency=None, recompute=None, top=10,
           zero_stages=(0, 1, 2, 3), micro_batches=(1, 2, 4, 8), virtual_stages=(1, 2, 4),
           sequence_parallel=(False, True), context_parallel=(1,), dp_overlap=0.0):
    """Feasible layouts for ``num_gpus``, fastest (model FLOP/s) first: a list of
    ``Prediction``. Tries every TP that divides the heads (within a node), every pipeline depth
    that divides the GPUs (stages may hold unequal numbers of layers), interleaving, sequence
    parallelism, ZeRO, micro-batch sizes and, unless ``recompute`` is given, all three
    recomputation modes."""
    hw = get_hardware(hardware)
    modes = RECOMPUTE if recompute is None else (recompute_mode(recompute),)
    tps = [t for t in range(1, hw.gpus_per_node + 1) if model.num_heads % t == 0
           and (model.num_kv_heads or model.num_heads) % t == 0]
    found = []
    for tp, cp in itertools.product(tps, context_parallel):
        for pp in range(1, min(model.num_layers, num_gpus) + 1):
            if num_gpus % (tp * cp * pp):
                continue
            dp = num_gpus // (tp * cp * pp)
            for zero, mb, v, sp, mode in itertools.product(
                    zero_stages, micro_batches, virtual_stages, sequence_parallel, modes):
                if (zero and dp * cp == 1) or (v > 1 and pp == 1) or (sp and tp == 1):
                    continue
                layout = Layout(dp, tp, pp, zero, mb, v, sp, cp)
                try:
                    pred = predict(model, layout, batch_size, hw, efficiency, mode, dp_overlap)
                except ValueError:      # a combination that this batch or model cannot take
                    continue
                if pred.memory <= hw.memory:
                    found.append(pred)
    found.sort(key=lambda p: -p.flops_per_gpu)
    return found[:top]
