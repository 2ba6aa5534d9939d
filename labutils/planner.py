"""A scaling planner: memory and throughput of transformer training layouts, checked against
published runs. Used by 07_conclusion_outlook (and 06c for the ZeRO memory formula).

Memory: mixed-precision Adam keeps 2 + 2 + 12 bytes per parameter (fp16 weights, fp16
gradients, fp32 master weights, momentum and variance; Rajbhandari et al. 2020); ZeRO stages
1/2/3 shard the last 12, then the gradients, then the weights over the data-parallel ranks.
Activations follow Korthikanti et al. 2022 (with full recomputation a layer keeps its input).

Throughput: the model FLOPs of one iteration (Narayanan et al. 2021, eq. 3) at ``efficiency``
of the chip's peak, plus the pipeline bubble, tensor-parallel all-reduces on the node's link,
pipeline messages and the data-parallel gradient all-reduce on the network, all from
``labutils.costmodel``. ``efficiency`` is the one constant fitted to a published run.
"""
from __future__ import annotations

import csv
import itertools
import os
from dataclasses import dataclass

from . import costmodel as cm

BYTES_PER_PARAM = 16  # fp16 weights 2 + fp16 grads 2 + fp32 weights, momentum, variance 12
DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                    "published")


def zero_memory_per_gpu(num_params, world_size, stage):
    """Bytes of model state per GPU under ZeRO ``stage`` (0 = plain data parallelism)."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3; got {stage!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1; got {world_size!r}")
    psi, nd = float(num_params), world_size
    weights, grads, optim = 2 * psi, 2 * psi, 12 * psi
    if stage >= 1:
        optim /= nd
    if stage >= 2:
        grads /= nd
    if stage >= 3:
        weights /= nd
    return weights + grads + optim


@dataclass(frozen=True)
class Transformer:
    """A GPT: ``num_layers`` blocks of width ``hidden``; sequence ``seq_len`` tokens."""
    num_layers: int
    hidden: int
    num_heads: int
    seq_len: int = 2048
    vocab: int = 51200

    @property
    def num_params(self):
        """Narayanan et al. 2021, eq. 2: 12 l h^2 (1 + 13/(12h) + (V+s)/(12lh))."""
        l, h = self.num_layers, self.hidden
        return 12 * l * h * h * (1 + 13 / (12 * h) + (self.vocab + self.seq_len) / (12 * l * h))

    def iteration_flops(self, batch_size, recompute=True):
        """Model FLOPs of one iteration (eq. 3): 96 B s l h^2 (1 + s/6h + V/16lh) with full
        recomputation (a 4th forward pass); 72 B s l h^2 (1 + s/6h + V/12lh) without."""
        B, s, l, h, V = batch_size, self.seq_len, self.num_layers, self.hidden, self.vocab
        if recompute:
            return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


@dataclass(frozen=True)
class Hardware:
    """A GPU and its two network tiers: ``intra`` inside a node, ``inter`` between nodes."""
    name: str
    peak_flops: float        # dense bf16/fp16 FLOP/s of one GPU
    memory: float            # bytes of one GPU
    gpus_per_node: int
    intra: cm.Link
    inter: cm.Link           # per GPU: a node's adapters shared among its GPUs


HARDWARE = {hw.name: hw for hw in (
    Hardware("A100-80GB", 312e12, 80e9, 8, cm.LINKS["NVLink"], cm.LINKS["200Gb-IB"]),
    # DGX-2H: 16 V100 on NVSwitch; 8 x 100 Gb/s adapters shared by 16 GPUs. Peak as implied
    # by Shoeybi et al. ("39 TFLOP/s, 30% of peak").
    Hardware("V100-DGX-2H", 130e12, 32e9, 16, cm.LINKS["NVLink-V100"],
             cm.Link("8x100Gb-IB/16", 6.25e9, 5e-6, "DGX-2H: 8 EDR adapters, 16 GPUs")),
    Hardware("H100-80GB", 989e12, 80e9, 8, cm.Link("NVLink4", 450e9, 3e-6, "H100 NVLink4"),
             cm.Link("400Gb-IB", 50e9, 5e-6, "NDR InfiniBand, one adapter per GPU")),
)}


@dataclass(frozen=True)
class Layout:
    """How the GPUs are used: dp x tp x pp GPUs, ZeRO stage, micro-batch size."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    micro_batch: int = 1

    @property
    def world_size(self):
        return self.dp * self.tp * self.pp


def _check_layout(model, layout, batch_size):
    if min(layout.dp, layout.tp, layout.pp, layout.micro_batch) < 1:
        raise ValueError(f"dp, tp, pp and micro_batch must be >= 1; got {layout}")
    if model.num_layers % layout.pp:
        raise ValueError(f"pp={layout.pp} must divide num_layers={model.num_layers}")
    if batch_size % (layout.dp * layout.micro_batch):
        raise ValueError(f"batch_size={batch_size} must be a multiple of dp x micro_batch = "
                         f"{layout.dp * layout.micro_batch}")


def memory_per_gpu(model, layout, recompute=True, bytes_per_value=2):
    """Bytes on the busiest GPU (first pipeline stage): model states + activations."""
    shard = model.num_params / (layout.tp * layout.pp)
    states = zero_memory_per_gpu(shard, layout.dp, layout.zero)
    s, b, h, a, t = model.seq_len, layout.micro_batch, model.hidden, model.num_heads, layout.tp
    if recompute:  # only each layer's input is kept; fp16 -> 2 bytes per value
        per_layer = bytes_per_value * s * b * h
    else:  # Korthikanti et al. 2022, eq. 2 (tensor parallel, no sequence parallel)
        per_layer = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    # 1F1B: the first stage holds pp micro-batches in flight, each of num_layers/pp layers
    activations = per_layer * model.num_layers
    return states + activations


@dataclass(frozen=True)
class Prediction:
    layout: Layout
    step: cm.StepTime
    flops_per_gpu: float     # model FLOP/s per GPU
    memory: float            # bytes per GPU

    @property
    def tflops_per_gpu(self):
        return self.flops_per_gpu / 1e12


def _dp_network(hw, model_parallel_size):
    """The network as one data-parallel group sees it: the ``g`` GPUs of a group that share a
    node send through ``g`` adapters at once (NCCL runs one ring per adapter), while the
    node's other GPUs serve the other groups; so the group's ring gets g adapters' bandwidth."""
    g = max(1, hw.gpus_per_node // model_parallel_size)
    return cm.Link(f"{hw.inter.name} x{g}", min(hw.inter.bandwidth * g, hw.intra.bandwidth),
                   hw.inter.latency)


def predict(model, layout, batch_size, hardware, efficiency, recompute=True, dp_overlap=0.0):
    """Predicted step time and per-GPU model FLOP/s of ``layout`` on ``hardware``."""
    _check_layout(model, layout, batch_size)
    hw = HARDWARE[hardware] if isinstance(hardware, str) else hardware
    n, dp, tp, pp = layout.world_size, layout.dp, layout.tp, layout.pp
    flops = model.iteration_flops(batch_size, recompute)
    m = batch_size // (dp * layout.micro_batch)       # micro-batches per pipeline
    compute = flops / (n * hw.peak_flops * efficiency)
    act = layout.micro_batch * model.seq_len * model.hidden * 2   # fp16 activations, bytes
    tp_link = hw.intra if tp <= hw.gpus_per_node else hw.inter
    tp_comm = cm.tensor_parallel_step(0.0, tp, m * model.num_layers // pp, act, tp_link,
                                      recompute=recompute).comm
    pp_link = hw.intra if tp * pp <= hw.gpus_per_node else hw.inter
    pipe = cm.pipeline_step(compute + tp_comm, pp, m, act // tp, pp_link)  # Megatron scatters
    dp_link = hw.intra if n <= hw.gpus_per_node else _dp_network(hw, tp * pp)
    grads = cm.zero_step(pipe.total, model.num_params / (tp * pp), dp, layout.zero, dp_link,
                         overlap=dp_overlap)
    step = cm.StepTime(compute, tp_comm + pipe.comm + grads.comm,
                       tp_comm + pipe.exposed_comm + grads.exposed_comm, pipe.bubble)
    return Prediction(layout, step, flops / (n * step.total),
                      memory_per_gpu(model, layout, recompute))


def calibrate(model, layout, batch_size, hardware, measured_flops_per_gpu, **kwargs):
    """The ``efficiency`` at which ``predict`` gives the measured per-GPU FLOP/s (bisection:
    throughput rises monotonically with efficiency)."""
    lo, hi = 1e-4, 1.0
    if predict(model, layout, batch_size, hardware, hi, **kwargs).flops_per_gpu < \
            measured_flops_per_gpu:
        raise ValueError("the measured throughput exceeds what the model allows at 100% of "
                         "peak; check the hardware's peak and the FLOP count")
    for _ in range(60):
        mid = (lo + hi) / 2
        if predict(model, layout, batch_size, hardware, mid, **kwargs).flops_per_gpu < \
                measured_flops_per_gpu:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def search(model, num_gpus, batch_size, hardware, efficiency, recompute=True, top=10,
           zero_stages=(0, 1, 2, 3), micro_batches=(1, 2, 4, 8)):
    """Feasible layouts for ``num_gpus``, fastest first: a list of ``Prediction``."""
    hw = HARDWARE[hardware] if isinstance(hardware, str) else hardware
    powers = [2 ** k for k in range(16) if 2 ** k <= num_gpus]
    found = []
    for tp, pp, zero, mb in itertools.product(powers, range(1, model.num_layers + 1),
                                              zero_stages, micro_batches):
        if tp > hw.gpus_per_node or num_gpus % (tp * pp) or model.num_layers % pp:
            continue
        layout = Layout(num_gpus // (tp * pp), tp, pp, zero, mb)
        if batch_size % (layout.dp * mb) or (zero and layout.dp == 1):
            continue
        pred = predict(model, layout, batch_size, hw, efficiency, recompute)
        if pred.memory <= hw.memory:
            found.append(pred)
    found.sort(key=lambda p: -p.flops_per_gpu)
    return found[:top]


# ---- published rows --------------------------------------------------------------------------

def _read(name):
    with open(os.path.join(DATA, name)) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def narayanan2021():
    """Rows of Narayanan et al. 2021, Table 1, as (Transformer, Layout, batch, TFLOP/s/GPU)."""
    rows = []
    for r in _read("narayanan2021_table1.csv"):
        model = Transformer(int(r["num_layers"]), int(r["hidden_size"]),
                            int(r["attention_heads"]), 2048, 51200)
        tp, pp, n = int(r["tensor_parallel"]), int(r["pipeline_parallel"]), int(r["num_gpus"])
        rows.append(dict(params_billion=float(r["params_billion"]), model=model,
                         layout=Layout(n // (tp * pp), tp, pp), batch_size=int(r["batch_size"]),
                         tflops_per_gpu=float(r["tflops_per_gpu"]),
                         aggregate_pflops=float(r["aggregate_pflops"])))
    return rows


def shoeybi2019():
    """Rows of Shoeybi et al. 2019 (Table 1 configurations, Figure 5 efficiencies)."""
    return [dict(params_billion=float(r["params_billion"]),
                 model=Transformer(int(r["num_layers"]), int(r["hidden_size"]),
                                   int(r["attention_heads"]), 1024, 51200),
                 mp=int(r["model_parallel_gpus"]), mp_eff=float(r["model_parallel_efficiency"]),
                 mpdp_gpus=int(r["data_parallel_gpus"]),
                 mpdp_eff=float(r["model_data_parallel_efficiency"]))
            for r in _read("shoeybi2019_weak_scaling.csv")]


def compare_narayanan(calibrate_on=6, hardware="A100-80GB"):
    """Calibrate ``efficiency`` on one row (default: 145.6 B, the middle of the table and the
    first to use data, tensor and pipeline parallelism at once), predict every row."""
    rows = narayanan2021()
    ref = rows[calibrate_on]
    eff = calibrate(ref["model"], ref["layout"], ref["batch_size"], hardware,
                    ref["tflops_per_gpu"] * 1e12)
    out = []
    for r in rows:
        pred = predict(r["model"], r["layout"], r["batch_size"], hardware, eff)
        out.append(dict(params_billion=r["params_billion"], layout=r["layout"],
                        published=r["tflops_per_gpu"], predicted=pred.tflops_per_gpu,
                        error=pred.tflops_per_gpu / r["tflops_per_gpu"] - 1, efficiency=eff))
    return out


def compare_shoeybi(hardware="V100-DGX-2H", batch_per_replica=8, baseline_tflops=39.0):
    """Weak-scaling efficiency predicted vs Figure 5, calibrated on the 1-GPU baseline."""
    rows = shoeybi2019()
    base = rows[0]
    eff = calibrate(base["model"], Layout(), batch_per_replica, hardware, baseline_tflops * 1e12)
    out = []
    for r in rows:
        for gpus, published, dp in ((r["mp"], r["mp_eff"], 1),
                                    (r["mpdp_gpus"], r["mpdp_eff"], r["mpdp_gpus"] // r["mp"])):
            layout = Layout(dp=dp, tp=r["mp"])
            pred = predict(r["model"], layout, batch_per_replica * dp, hardware, eff)
            predicted = pred.flops_per_gpu / (baseline_tflops * 1e12)
            out.append(dict(params_billion=r["params_billion"], gpus=gpus, layout=layout,
                            published=published, predicted=predicted,
                            error=predicted - published))
    return out



# ---- exercise: ZeRO memory per GPU -------------------------------------------------------------

def _zero_memory_harness(rank, world_size, learner_fn, seed):
    """Each rank checks one stage with Nd = this launch's world size (stage = rank % 4)."""
    import random
    rng = random.Random(seed)
    num_params = rng.choice([7.5e9, 1.3e9, 175e9, 1e6])
    stages = [rank % 4] if world_size >= 4 else [rank % 4, (rank + 2) % 4]
    expected, got = {}, {}
    for stage in stages:
        key = f"num_params={num_params:g}, world_size={world_size}, stage={stage}"
        expected[key] = zero_memory_per_gpu(num_params, world_size, stage)
        got[key] = learner_fn(num_params, world_size, stage)
    return expected, got


def check_zero_memory_per_gpu(learner_fn, *, timeout=30.0):
    """Check ``learner_fn(num_params, world_size, stage)`` -> bytes per GPU for ZeRO 0-3."""
    from .exercises import make_cases, run_check
    cases = make_cases(world_sizes=(2, 4), per_world_size=1, seed=3)
    return run_check("zero_memory_per_gpu", learner_fn, _zero_memory_harness, cases,
                     timeout=timeout, atol=0.0, rtol=1e-9)
