"""What the scaling planner plans for: the model (``Transformer``), the machine (``Hardware``)
and how the GPUs are used (``Layout``), plus the ZeRO model-state formula.
``labutils.cost.planner`` predicts step time and memory from them.

``Transformer`` covers today's decoder-only LLMs: FFN width, grouped-query attention, tied or
untied embeddings, gated (SwiGLU) MLPs; its parameter and FLOP counts are exact for the
architecture its docstring describes (tests instantiate one and count).
"""
from __future__ import annotations

from dataclasses import dataclass

from labutils.core.i18n import N_
from labutils.cost import costmodel as cm
from labutils.cost.parallel_dims import ParallelDims

RECOMPUTE = (N_("none"), N_("selective"), N_("full"))


def zero_state_bytes(num_params, world_size, stage, weight_bytes=4, grad_bytes=4,
                     optimizer_bytes=8):
    """Model-state bytes per rank under ZeRO ``stage`` (0 = plain data parallelism; paper,
    figure 1): weights, gradients and optimiser state, the last sharded from stage 1, gradients
    from 2, weights from 3. Defaults: fp32 Adam (momentum and variance, 8 bytes); mixed
    precision is (2, 2, 12)."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3; got {stage!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1; got {world_size!r}")
    psi, n = float(num_params), world_size
    return (weight_bytes * psi / (n if stage >= 3 else 1)
            + grad_bytes * psi / (n if stage >= 2 else 1)
            + optimizer_bytes * psi / (n if stage >= 1 else 1))


def zero_memory_per_gpu(num_params, world_size, stage):
    """Bytes of model state per GPU under ZeRO ``stage`` with mixed-precision Adam: fp16 weights
    and gradients (2 + 2 bytes), fp32 master weights, momentum and variance (12)."""
    return zero_state_bytes(num_params, world_size, stage, 2, 2, 12)


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer, counted as built: token (and learned position) embeddings;
    per layer two LayerNorms (weight and bias), Q/K/V and output projections with biases,
    an MLP with biases (``gated_mlp``: gate, up and down projections, as SwiGLU); a final
    LayerNorm; logits through the embedding (``tied_embeddings``) or their own matrix.
    ``ffn_hidden`` defaults to 4 x hidden, ``num_kv_heads`` to ``num_heads`` (no GQA).
    ``dropout=False``: a model without dropout (Llama), whose layers store no dropout masks.
    ``num_experts > 1`` makes every MLP a mixture of experts (GShard/Switch/Mixtral): that many
    MLPs and a bias-free router (h x E); each token runs ``top_k`` of them, and an expert takes
    at most ``capacity_factor`` x its even share of the tokens (the all-to-alls carry that
    padded size; the FLOPs count only the routed tokens)."""
    num_layers: int
    hidden: int
    num_heads: int
    seq_len: int = 2048
    vocab: int = 51200
    ffn_hidden: int | None = None
    num_kv_heads: int | None = None
    tied_embeddings: bool = True
    gated_mlp: bool = False
    num_experts: int = 1
    top_k: int = 1
    capacity_factor: float = 1.0
    dropout: bool = True      # False: no dropout layers (Llama), so no dropout masks stored

    @property
    def ffn(self):
        return self.ffn_hidden or 4 * self.hidden

    @property
    def kv_hidden(self):
        """Width of K (and of V): KV heads x head size."""
        return (self.num_kv_heads or self.num_heads) * (self.hidden // self.num_heads)

    @property
    def layer_params(self):
        h, f, kv = self.hidden, self.ffn, self.kv_hidden
        attention = h * (h + 2 * kv) + (h + 2 * kv) + h * h + h
        mlp = 3 * h * f + 2 * f + h if self.gated_mlp else 2 * h * f + f + h
        if self.num_experts > 1:
            mlp = self.num_experts * mlp + h * self.num_experts     # experts + router
        return attention + mlp + 4 * h                      # + two LayerNorms

    @property
    def expert_params(self):
        """Parameters of one layer's experts (0 for a dense model): what EP shards."""
        if self.num_experts == 1:
            return 0
        h, f = self.hidden, self.ffn
        return self.num_experts * (3 * h * f + 2 * f + h if self.gated_mlp else 2 * h * f + f + h)

    @property
    def embedding_params(self):
        return self.vocab * self.hidden + self.seq_len * self.hidden

    @property
    def num_params(self):
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return (self.num_layers * self.layer_params + self.embedding_params + 2 * self.hidden
                + head)

    def layer_flops(self, tokens, seq_len=None):
        """Forward FLOPs of one layer on ``tokens`` tokens of sequences of ``seq_len``: the
        matmuls, 2 FLOPs per multiply-add (attention scores and values included, dense)."""
        h, f, kv, s = self.hidden, self.ffn, self.kv_hidden, seq_len or self.seq_len
        mlp = (3 if self.gated_mlp else 2) * 2 * tokens * h * f
        if self.num_experts > 1:     # each token through top_k experts, plus the router
            mlp = self.top_k * mlp + 2 * tokens * h * self.num_experts
        return 2 * tokens * h * (h + 2 * kv) + 2 * tokens * h * h + mlp + self.attention_flops(
            tokens, s)

    def attention_flops(self, tokens, seq_len=None):
        """Forward FLOPs of one layer's scores and weighted values: 4 x tokens x s x h."""
        return 4 * tokens * (seq_len or self.seq_len) * self.hidden

    def logits_flops(self, tokens):
        return 2 * tokens * self.hidden * self.vocab

    def iteration_flops(self, batch_size, recompute=True):
        """FLOPs of one iteration of ``batch_size`` sequences: forward + backward (3 x the
        forward) and what ``recompute`` repeats ("full": every layer's forward again, so the
        96 B s l h^2 (1 + s/6h + V/16lh) of Narayanan et al. 2021, eq. 3; "selective": the
        attention scores). ``recompute=False``/"none" gives model FLOPs."""
        mode = recompute_mode(recompute)
        tokens = batch_size * self.seq_len
        layer, logits = self.layer_flops(tokens), self.logits_flops(tokens)
        total = 3 * (self.num_layers * layer + logits)
        if mode == "full":
            total += self.num_layers * layer
        elif mode == "selective":
            total += self.num_layers * self.attention_flops(tokens)
        return total


def recompute_mode(recompute):
    """True -> "full", False -> "none"; or one of "none", "selective", "full"."""
    if recompute is True or recompute is False:
        return "full" if recompute else "none"
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be True, False or one of {RECOMPUTE}; got {recompute!r}")
    return recompute


@dataclass(frozen=True)
class Hardware:
    """A GPU and its two network tiers: ``intra`` inside a node, ``inter`` between nodes.
    ``efficiency``: the default fraction of ``peak_flops`` that dense training arithmetic
    reaches (see ``HARDWARE`` for where each value comes from)."""
    name: str
    peak_flops: float        # dense bf16/fp16 FLOP/s of one GPU (datasheet)
    memory: float            # bytes of one GPU (datasheet)
    gpus_per_node: int
    intra: cm.Link
    inter: cm.Link           # per GPU: a node's adapters shared among its GPUs
    efficiency: float | None = None
    hbm_bandwidth: float = 2.0e12    # bytes/s of the GPU's memory (datasheet)
    # GEMM efficiency falls with the per-GPU matrix width x = hidden / tp: the matmuls reach
    # efficiency x x / (x + gemm_half_width) of peak (0: no shape dependence). Fitted with
    # ``efficiency`` (labutils.cost.published.FITS names the rows).
    gemm_half_width: float = 0.0
    # the fraction of the links' datasheet rate that collectives reach (NCCL's bus bandwidth
    # over the line rate); fitted with ``efficiency``
    link_efficiency: float = 1.0

    def links(self):
        """(intra, inter) at the rate collectives reach: datasheet x ``link_efficiency``."""
        f = self.link_efficiency
        return tuple(cm.Link(k.name, k.bandwidth * f, k.latency, k.note)
                     for k in (self.intra, self.inter))

    def gemm_efficiency(self, width, efficiency=None):
        """Fraction of peak the matmuls of a ``width``-wide per-GPU layer reach."""
        eff = self.efficiency if efficiency is None else efficiency
        return eff * width / (width + self.gemm_half_width)


# What a job cannot use of a GPU's memory: CUDA context and kernels' workspace, NCCL's buffers,
# the caching allocator's fragmentation. An allowance, not a fit: 2 GB plus 8% of the memory
# (PyTorch and NCCL report 1-3 GB of fixed cost; fragmentation of a few percent is common).
MEMORY_RESERVE_BYTES, MEMORY_RESERVE_SHARE = 2e9, 0.08


def usable_memory(hardware):
    """Bytes a layout may plan to use on one GPU of ``hardware``: its memory less the reserve."""
    return hardware.memory * (1 - MEMORY_RESERVE_SHARE) - MEMORY_RESERVE_BYTES


# Peaks, memory and links are datasheet values. The efficiencies are fitted to named published
# rows and nothing else (labutils.published.FITS says which; tests re-derive them):
# A100: efficiency fitted to the ten rows of Narayanan et al. 2021, Table 1 (gemm_half_width
# and link_efficiency were fitted with it and sit at their bounds, 0 and 1: those rows do not
# support them); V100: Shoeybi et al. 2019's 1-GPU baseline; H100: efficiency to one row chosen
# before any prediction (Llama 3 405B on 8,192 GPUs), the other two borrowed from the A100.
A100_EFFICIENCY, A100_HALF_WIDTH = 0.6367, 0.0
V100_EFFICIENCY = 0.3548
H100_EFFICIENCY = 0.7752
HARDWARE = {hw.name: hw for hw in (
    Hardware("A100-80GB", 312e12, 80e9, 8, cm.LINKS["NVLink"], cm.LINKS["200Gb-IB"],
             A100_EFFICIENCY, 2.039e12, A100_HALF_WIDTH),
    Hardware("A100-40GB", 312e12, 40e9, 8, cm.LINKS["NVLink"], cm.LINKS["200Gb-IB"],
             A100_EFFICIENCY, 1.555e12, A100_HALF_WIDTH),
    # DGX-2H: 16 V100 on NVSwitch; 8 x 100 Gb/s adapters shared by 16 GPUs. Peak as implied
    # by Shoeybi et al. ("39 TFLOP/s, 30% of peak").
    Hardware("V100-DGX-2H", 130e12, 32e9, 16, cm.LINKS["NVLink-V100"],
             cm.Link("8x100Gb-IB/16", 6.25e9, 5e-6, N_("DGX-2H: 8 EDR adapters, 16 GPUs")),
             V100_EFFICIENCY, 0.9e12),
    Hardware("H100-80GB", 989e12, 80e9, 8, cm.Link("NVLink4", 450e9, 3e-6, N_("H100 NVLink4")),
             cm.Link("400Gb-IB", 50e9, 5e-6, N_("NDR InfiniBand, one adapter per GPU")),
             H100_EFFICIENCY, 3.35e12, A100_HALF_WIDTH),
)}


def get_hardware(hardware):
    if isinstance(hardware, Hardware):
        return hardware
    if hardware not in HARDWARE:
        raise ValueError(f"unknown hardware {hardware!r}; use one of {', '.join(HARDWARE)} "
                         f"or a planner.Hardware(...)")
    return HARDWARE[hardware]


@dataclass(frozen=True)
class Layout:
    """How the GPUs are used: dp x tp x pp x context_parallel GPUs, ZeRO stage, micro-batch
    size; ``virtual_stages`` model chunks per pipeline rank (interleaved 1F1B);
    ``sequence_parallel`` (Megatron: LayerNorm and dropout activations split over TP ranks);
    ``stage_layers``: layers per pipeline rank (default: as even as possible, the first ranks
    taking the remainder); ``context_algorithm``: how the ``context_parallel`` ranks attend,
    "ring" (ring attention) or "ulysses" (DeepSpeed-Ulysses all-to-alls);
    ``expert_parallel``: ranks that share one layer's experts, carved out of the
    dp x context_parallel ranks (as Megatron-Core does), so the GPU count does not change.
    ``flash_attention``: attention computed in tiles (FlashAttention), so the s x s scores are
    never stored nor written to memory (its backward recomputes them: count that FLOP as
    recompute="selective" does); FLOPs are counted dense (causal masking's skipped half is not
    subtracted, as Megatron's and most MFU formulas do). ``grad_bytes``: bytes of each
    gradient kept for the optimizer: 2 (the default: fp16 gradients, the ZeRO paper's 16
    bytes/param) or 4 (Megatron's fp32 main gradients: with the bf16 weights, fp32 master
    weights and Adam's two moments 18 bytes/param, or 6 + 12/d with zero=1, its distributed
    optimizer; the published runs and ``planner.search`` use 4). ``tp_overlap``: the backward's
    tensor-parallel collective after each column-parallel linear (QKV, the MLP's first) runs
    during that linear's weight-gradient GEMM (Megatron-LM's asynchronous TP all-reduce, or
    with sequence parallelism its reduce-scatter; Megatron-LM since 2022)."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    micro_batch: int = 1
    virtual_stages: int = 1
    sequence_parallel: bool = False
    context_parallel: int = 1
    stage_layers: tuple | None = None
    context_algorithm: str = "ring"
    expert_parallel: int = 1
    flash_attention: bool = False
    grad_bytes: int = 2
    tp_overlap: bool = False

    @property
    def cp(self):
        return self.context_parallel

    @property
    def ep(self):
        return self.expert_parallel

    @property
    def world_size(self):
        return self.dp * self.tp * self.pp * self.context_parallel

    @property
    def dims(self):
        """The same layout as the lessons' ``ParallelDims`` (06e runs it): the mesh order
        (pp, dp, cp, tp), each rank's coordinates and groups; refuses a size that is not a
        whole number >= 1, naming it."""
        return ParallelDims(dp=self.dp, tp=self.tp, pp=self.pp, cp=self.context_parallel)

    def layers_per_stage(self, num_layers):
        if self.stage_layers is not None:
            return tuple(self.stage_layers)
        q, r = divmod(num_layers, self.pp)
        return tuple(q + (i < r) for i in range(self.pp))
