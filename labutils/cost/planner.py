"""A scaling planner: memory and step time of transformer training layouts on many GPUs.
Used by 07_conclusion_outlook (and 06c1, 06c2 for the ZeRO memory formula); checked against
published runs in ``labutils.cost.published``. What it plans for (``Transformer``,
``Hardware``, ``Layout``) lives in ``labutils.cost.planspec``, the checks a layout must pass in
``labutils.cost.plan_checks``; the names it needs are imported here.

``predict`` builds one micro-batch on the slowest pipeline rank: its arithmetic (FLOPs over
``efficiency`` x peak, and the memory-bound operations between the matmuls at the HBM's
bandwidth) plus the communication on its critical path (tensor-parallel all-reduces, or with
sequence parallelism the reduce-scatters and all-gathers that move the same bytes; pipeline
messages; the part of ring attention's K/V transfer that outlasts the attention it hides
behind, or Ulysses' all-to-alls; expert parallelism's all-to-alls; all from
``labutils.cost.long_context``; with ``Layout.tp_overlap`` the backward's input-gradient
collectives of QKV and the MLP's first linear hide behind their weight gradients). The 1F1B
schedule runs m such slots plus (p-1)/v of fill and drain, so the bubble share is
(p-1)/(v m + p - 1); then the data-parallel gradient traffic that backward does not hide is
added (gradients at ``Layout.grad_bytes`` each, as the stack reduces them, weights gathered in
bf16; ZeRO-2/3 per micro-batch; with ZeRO 0/1 the one reduction can hide only behind the last
micro-batch's backward). The matmuls run at ``Hardware.gemm_efficiency(hidden / tp)`` of peak:
narrower per-GPU matrices, lower efficiency. A group of GPUs is priced at NVLink speed only
when it fits in a node and divides it (groups of 6 on 8-GPU nodes straddle nodes), else at the
network's. Memory is the busiest pipeline rank's model states (ZeRO) plus activations
(``labutils.cost.plan_memory``: Korthikanti et al. 2022, generalised to any FFN width, KV heads
and experts; as many micro-batches as the schedule keeps in flight), the first rank's
embedding, the last rank's fp32 logits, and with recomputation one layer's full working set.

Two FLOP conventions: ``Prediction.tflops_per_gpu`` counts model FLOPs (3 x the forward;
recomputation not counted, as "MFU" does); ``hardware_tflops_per_gpu`` also counts what is
recomputed (as "HFU" does, and as Narayanan et al. 2021's table did with full recomputation).
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from labutils.core.i18n import N_
from labutils.cost import costmodel as cm
from labutils.cost import long_context as lc
from labutils.cost.plan_checks import validate_layout
from labutils.cost.plan_memory import (  # noqa: F401
    layer_activation_bytes,
    memory_per_gpu,
    memory_per_stage,
    stage_expert_params,
    stage_params,
)
from labutils.cost.planspec import (  # noqa: F401
    A100_EFFICIENCY,
    HARDWARE,
    RECOMPUTE,
    H100_EFFICIENCY,
    Hardware,
    Layout,
    Transformer,
    get_hardware,
    recompute_mode,
    usable_memory,
    zero_memory_per_gpu,
)
from labutils.cost.step_time import StepTime, _overlapped

# the memory model moved to plan_memory; these names stay for code that used them here
_layer_activation_bytes, _memory_per_stage, _stage_params = (layer_activation_bytes,
                                                             memory_per_stage, stage_params)


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
    usable_memory: float = float("inf")   # bytes a layout may use: memory less the reserve

    @property
    def fits(self):
        return self.memory <= self.usable_memory

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
    """The intra-node link for a group of ``span`` consecutive GPUs that fits in a node and
    divides it (so every group stays inside one node), else the network: 6-wide groups on
    8-GPU nodes put ranks 6-11 on two nodes, and a ring is as slow as its slowest hop."""
    return hw.intra if span <= hw.gpus_per_node and hw.gpus_per_node % span == 0 else hw.inter


def _dp_comm(grad_params, group, zero, m, link, grad_bytes=4):
    """Seconds of data-parallel traffic per step. The gradients travel at ``grad_bytes`` each,
    as the stack reduces them (Megatron-LM reduces its fp32 main gradients: 4; fp16 gradients:
    2), the weights at 2 (bf16). ZeRO 0: one all-reduce of the gradients; ZeRO-1 (Megatron's
    distributed optimizer): a reduce-scatter of the gradients and an all-gather of the updated
    weights; ZeRO-2 reduce-scatters each micro-batch's gradients and gathers the weights once;
    ZeRO-3 also gathers the weights for each micro-batch's forward and again for its backward."""
    if group == 1:
        return 0.0
    ab = (link.alpha, link.beta)
    grads, weights = grad_bytes * grad_params, 2 * grad_params
    if zero == 0:
        return cm.allreduce_time(grads, group, *ab)
    rs, ag = cm.reduce_scatter_time(grads, group, *ab), cm.all_gather_time(weights, group, *ab)
    return {1: rs + ag, 2: m * rs + ag, 3: m * (rs + 2 * ag)}[zero]


def _max_efficiency(hw, model, layout):
    """The largest ``efficiency`` that keeps the matmuls at or below 100% of peak."""
    return 1 / hw.gemm_efficiency(model.hidden / layout.tp, 1.0)


def predict(model, layout, batch_size, hardware, efficiency=None, recompute=True, dp_overlap=0.0):
    """Predicted step time, per-GPU FLOP/s and memory of ``layout`` on ``hardware``.
    ``efficiency`` (the scale of ``Hardware.gemm_efficiency``) defaults to the hardware's
    fitted value; ``recompute`` is True
    ("full"), False ("none") or "selective"."""
    hw, mode = get_hardware(hardware), recompute_mode(recompute)
    eff = hw.efficiency if efficiency is None else efficiency
    if eff is None or not 0 < eff <= _max_efficiency(hw, model, layout):
        raise ValueError(f"efficiency must be in (0, 1] (or set on the Hardware); got {eff!r}")
    stages, m = validate_layout(model, layout, batch_size)
    if hw.link_efficiency != 1.0:   # the rates collectives reach, in place of the datasheet's
        intra, inter = hw.links()
        hw = dataclasses.replace(hw, intra=intra, inter=inter, link_efficiency=1.0)
    L, speed = layout, hw.peak_flops * hw.gemm_efficiency(model.hidden / layout.tp, eff)
    tp, pp, cp, v = L.tp, L.pp, L.context_parallel, L.virtual_stages
    tokens = L.micro_batch * model.seq_len // cp            # this rank's tokens per micro-batch
    layer_fwd, attn_fwd = model.layer_flops(tokens) / tp, model.attention_flops(tokens) / tp
    layer = ((4 if mode == "full" else 3) * layer_fwd
             + (attn_fwd if mode == "selective" else 0)) / speed
    logits = 3 * model.logits_flops(tokens) / tp / speed
    # the memory-bound work between the matmuls (LayerNorm, softmax, GeLU, dropout, residual
    # adds): each activation byte a layer stores is written and read in the forward pass, read
    # with its gradient coming in and going out in backward: about 5 bytes of HBM traffic
    # (an estimate from that count, not a fit). A recomputation repeats the forward's 2 bytes
    # of each byte it recomputes: all of them ("full"), or the attention scores that
    # "selective" drops (their softmax and dropout)
    stored = layer_activation_bytes(model, layout, "none")
    redone = {"none": 0.0, "full": stored,
              "selective": stored - layer_activation_bytes(model, layout, "selective")}[mode]
    elementwise = (5 * stored + 2 * redone) / hw.hbm_bandwidth
    layer += elementwise
    act = 2 * tokens * model.hidden                          # bf16 activations, bytes
    link, full = _link(hw, tp), mode == "full"
    if tp == 1:
        tp_comm = 0.0
    elif L.sequence_parallel:   # reduce-scatter + all-gather pairs: a ring all-reduce's bytes
        tp_comm = lc.sequence_parallel_time(tokens, 1, model.hidden, tp, link.alpha, link.beta,
                                            recompute=full)
    else:
        tp_comm = (6 if full else 4) * cm.allreduce_time(act, tp, link.alpha, link.beta)
    tp_hidden = 0.0
    if tp > 1 and L.tp_overlap:   # backward: QKV's and the MLP's first input gradients travel
        # (all-reduce, or reduce-scatter with SP) while their weight gradients are computed
        one = (cm.reduce_scatter_time(act, tp, link.alpha, link.beta) if L.sequence_parallel
               else cm.allreduce_time(act, tp, link.alpha, link.beta))
        width, mlp = model.hidden, model.ffn * (2 if model.gated_mlp else 1) * model.top_k
        wgrad = [2 * tokens * width * w / tp / speed for w in (width + 2 * model.kv_hidden, mlp)]
        tp_hidden = sum(min(one, w) for w in wgrad)
    cp_comm = cp_exposed = 0.0
    link = _link(hw, tp * cp)
    if cp > 1 and L.context_algorithm == "ring":   # hidden behind each block's attention
        cp_comm, cp_exposed = lc.ring_attention_time(
            model.seq_len, L.micro_batch, model.hidden / tp, cp, link.alpha, link.beta, speed,
            model.kv_hidden / tp, recompute=full)
    elif cp > 1:   # Ulysses: K/V heads repeated up to a multiple of cp, as ulysses_kv_heads says
        kv = lc.ulysses_kv_heads(model.num_heads // tp, (model.num_kv_heads or model.num_heads)
                                 // tp, cp) * (model.hidden // model.num_heads)
        cp_comm = cp_exposed = lc.ulysses_time(model.seq_len, L.micro_batch, model.hidden / tp,
                                               cp, link.alpha, link.beta, kv, recompute=full)
    ep_comm = 0.0
    if model.num_experts > 1 and L.expert_parallel > 1:   # each TP rank dispatches 1/tp
        link = _link(hw, tp * cp * L.expert_parallel)
        ep_comm = lc.expert_all_to_all_time(tokens / tp, model.hidden, L.expert_parallel,
                                            link.alpha, link.beta, model.top_k,
                                            model.capacity_factor, recompute=full)
    per_layer = tp_comm - tp_hidden + cp_exposed + ep_comm   # on the critical path
    work = [n * layer + (logits if i == pp - 1 else 0.0) for i, n in enumerate(stages)]
    slow = max(range(pp), key=lambda i: work[i] + stages[i] * per_layer)
    link = _link(hw, tp * cp * pp)
    pp_comm = (2 * v * cm.send_recv_time(act / tp, 2, link.alpha, link.beta) if pp > 1 else 0.0)
    slot_comm = stages[slow] * per_layer + pp_comm
    slot = work[slow] + slot_comm
    bubble = (pp - 1) * slot / v
    n_gpus = L.world_size
    dp_link = hw.intra if n_gpus <= hw.gpus_per_node else _dp_network(hw, tp * pp)
    params = stage_params(model, layout, stages)
    if model.num_experts == 1:
        dp_comm = _dp_comm(max(params), L.dp * cp, L.zero, m, dp_link, L.grad_bytes)
    else:   # expert gradients are reduced only over the ranks that hold the same experts
        big = max(range(pp), key=params.__getitem__)
        experts = stage_expert_params(model, layout, stages)[big]
        dp_comm = (_dp_comm(params[big] - experts, L.dp * cp, L.zero, m, dp_link, L.grad_bytes)
                   + _dp_comm(experts, L.dp * cp // L.expert_parallel, L.zero, m, dp_link,
                              L.grad_bytes))
    # ZeRO 0/1: the gradients are reduced once, after the last micro-batch's backward has
    # begun: only that backward can hide them; ZeRO-2/3 reduce each micro-batch's in its own
    window = m * work[slow] if L.zero >= 2 else work[slow]
    dp_exposed = _overlapped(window, dp_comm, dp_overlap)
    step = StepTime(m * work[slow], m * (stages[slow] * (tp_comm + cp_comm + ep_comm) + pp_comm)
                       + dp_comm, m * slot_comm + dp_exposed, bubble)
    terms = {N_("compute"): m * (work[slow] - stages[slow] * elementwise),
             N_("memory-bound ops"): m * stages[slow] * elementwise, N_("bubble"): bubble,
             N_("tensor parallel"): m * stages[slow] * (tp_comm - tp_hidden),
             N_("context parallel"): m * stages[slow] * cp_exposed,
             N_("expert parallel"): m * stages[slow] * ep_comm,
             N_("pipeline messages"): m * pp_comm, N_("data parallel"): dp_exposed}
    return Prediction(
        layout, step, model.iteration_flops(batch_size, "none") / (n_gpus * step.total),
        max(memory_per_stage(model, layout, mode, stages, m)),
        model.iteration_flops(batch_size, mode) / (n_gpus * step.total), mode,
        bubble / (m * slot + bubble), terms, usable_memory(hw))


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
    lo, hi = 1e-4, _max_efficiency(get_hardware(hardware), model, layout)
    if rate(hi) < measured_flops_per_gpu:
        raise ValueError("the measured throughput exceeds what the model allows at 100% of "
                         "peak; check the hardware's peak, the FLOP count and its convention")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rate(mid) < measured_flops_per_gpu else (lo, mid)
    return (lo + hi) / 2


def search(model, num_gpus, batch_size, hardware, efficiency=None, recompute=None, top=10,
           zero_stages=(0, 1, 2, 3), micro_batches=(1, 2, 4, 8), virtual_stages=(1, 2, 4),
           sequence_parallel=(False, True), context_parallel=(1,), dp_overlap=0.0,
           context_algorithms=("ring",), expert_parallel=(1,), flash_attention=False,
           grad_bytes=4):
    """Feasible layouts for ``num_gpus``, fastest (model FLOP/s) first: a list of
    ``Prediction``. Tries every TP that divides the heads up to a node's GPUs (one that does not
    divide the node is priced at the network's speed: see ``_link``), every pipeline depth
    that divides the GPUs (stages may hold unequal numbers of layers), interleaving, sequence
    parallelism, ZeRO, micro-batch sizes and, unless ``recompute`` is given, all three
    recomputation modes; context and expert parallelism only at the degrees given. A layout is
    kept if its memory fits ``usable_memory`` (the GPU's memory less a reserve), counting
    ``grad_bytes`` per gradient (4: Megatron's fp32 main gradients)."""
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
            for zero, mb, v, sp, mode, algo, ep in itertools.product(
                    zero_stages, micro_batches, virtual_stages, sequence_parallel, modes,
                    context_algorithms, expert_parallel):
                if (zero and dp * cp == 1) or (v > 1 and pp == 1) or (sp and tp == 1):
                    continue
                layout = Layout(dp, tp, pp, zero, mb, v, sp, cp, None, algo, ep,
                                flash_attention, grad_bytes)
                try:
                    pred = predict(model, layout, batch_size, hw, efficiency, mode, dp_overlap)
                except ValueError:      # a combination that this batch or model cannot take
                    continue
                if pred.fits:
                    found.append(pred)
    found.sort(key=lambda p: -p.flops_per_gpu)
    return found[:top]
