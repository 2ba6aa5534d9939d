"""Published training runs, and how far the planner's predictions are from them.

Every row comes from a paper's table (``data/published/*.csv``, each with its citation and
uncertainty). The planner's fitted constants are in ``labutils.cost.planspec.HARDWARE``:
``FITS`` says which rows each was fitted to (the A100's to Narayanan et al.'s ten, the H100's
and the V100's to one row each), and ``fitted_efficiency`` re-derives them. Every other row is held out:
``validate`` reports the planner's error on them beside a baseline that predicts the fitted
row's per-GPU throughput for every row of the same GPU.
"""
from __future__ import annotations

import csv
import dataclasses
import os

from labutils.core.env import ROOT
from labutils.cost import planner as pl

DATA = os.path.join(ROOT, "data", "published")


def _read(name):
    with open(os.path.join(DATA, name)) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def interleave_depth(stages):
    """The rule for an interleaved schedule whose depth the source does not print (written in
    data/published/README.md before any prediction): the smallest v >= 2 that divides every
    stage's layers (Megatron needs equal chunks), else 2 (chunks as even as the stage allows)."""
    for v in range(2, min(stages) + 1):
        if all(n % v == 0 for n in stages):
            return v
    return 2


def narayanan2021():
    """Narayanan et al. 2021, Table 1, as dicts with a Transformer, a Layout, the batch size
    and the published TFLOP/s per GPU (hardware FLOPs: full recomputation counted, eq. 3).
    Pipelined rows ran the interleaved schedule (the paper's Sec. 5.1); its depth is not
    printed, so ``interleave_depth`` gives it; micro-batch 1 (not printed; the README's rule)."""
    rows = []
    for r in _read("narayanan2021_table1.csv"):
        model = pl.Transformer(int(r["num_layers"]), int(r["hidden_size"]),
                               int(r["attention_heads"]), 2048, 51200)
        tp, pp, n = int(r["tensor_parallel"]), int(r["pipeline_parallel"]), int(r["num_gpus"])
        stages = pl.Layout(pp=pp).layers_per_stage(model.num_layers)
        v = interleave_depth(stages) if _flag(r, "interleaved", False) else 1
        rows.append(dict(source="Narayanan et al. 2021, Table 1",
                         name=f"GPT {float(r['params_billion']):g}B",
                         params_billion=float(r["params_billion"]), model=model,
                         layout=pl.Layout(n // (tp * pp), tp, pp, virtual_stages=v,
                                          sequence_parallel=False, grad_bytes=4),
                         batch_size=int(r["batch_size"]),
                         hardware="A100-80GB", recompute="full", convention="hardware",
                         tflops_per_gpu=float(r["tflops_per_gpu"]),
                         aggregate_pflops=float(r["aggregate_pflops"])))
    return rows


def shoeybi2019():
    """Rows of Shoeybi et al. 2019 (Table 1 configurations, Figure 5 efficiencies)."""
    return [dict(params_billion=float(r["params_billion"]),
                 model=pl.Transformer(int(r["num_layers"]), int(r["hidden_size"]),
                                      int(r["attention_heads"]), 1024, 51200),
                 mp=int(r["model_parallel_gpus"]), mp_eff=float(r["model_parallel_efficiency"]),
                 mpdp_gpus=int(r["data_parallel_gpus"]),
                 mpdp_eff=float(r["model_data_parallel_efficiency"]))
            for r in _read("shoeybi2019_weak_scaling.csv")]


# Each fitted constant and the rows it was fitted to, named before any held-out prediction.
FITS = {
    "A100-80GB": ("efficiency, gemm_half_width and link_efficiency",
                  "Narayanan et al. 2021, Table 1",
                  "all ten rows (1.7B-1T)"),
    "H100-80GB": ("efficiency", "Dubey et al. 2024 (Llama 3), Table 4",
                  "405B on 8,192 GPUs"),
    "V100-DGX-2H": ("efficiency", "Shoeybi et al. 2019", "1.2B on one GPU, 39 TFLOP/s"),
}
H100_FIT_GPUS = 8192      # the Llama 3 row the H100's efficiency is fitted to


def _hardware_rate(r, pred):
    return pred.flops_per_gpu if r.get("metric") == "model" else pred.hardware_flops_per_gpu


def _log_spread(hardware, rows, half_width, link_efficiency):
    """The efficiency each row needs with these constants: their geometric mean and spread
    (the variance of their logs)."""
    import math
    hw = dataclasses.replace(pl.get_hardware(hardware), gemm_half_width=half_width,
                             link_efficiency=link_efficiency)
    logs = [math.log(pl.calibrate(r["model"], r["layout"], r["batch_size"], hw,
                                  r["tflops_per_gpu"] * 1e12, convention="hardware",
                                  recompute=r["recompute"])) for r in rows]
    mean = sum(logs) / len(logs)
    return math.exp(mean), sum((x - mean) ** 2 for x in logs) / len(logs)


def _golden(f, lo, hi, steps=24):
    g = (5 ** 0.5 - 1) / 2
    for _ in range(steps):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        lo, hi = (lo, b) if f(a) < f(b) else (a, hi)
    return (lo + hi) / 2


def fit_gemm(hardware="A100-80GB", rows=None):
    """Fit ``(efficiency, gemm_half_width, link_efficiency)`` to ``rows`` (default: Narayanan
    et al.'s ten): the half-width (0-2000) and link fraction (0.3-1) that make the rows'
    calibrated efficiencies agree best (least squares in log; two rounds of golden-section
    search, one constant at a time), and the efficiencies' geometric mean."""
    rows = narayanan2021() if rows is None else rows
    x0, f = 0.0, 1.0
    for _ in range(2):
        x0 = _golden(lambda x: _log_spread(hardware, rows, x, f)[1], 0.0, 2000.0)
        f = _golden(lambda y: _log_spread(hardware, rows, x0, y)[1], 0.3, 1.0)
    return _log_spread(hardware, rows, x0, f)[0], x0, f


def h100_fit_row():
    return next(r for r in runs_2022_2024() if "llama3" in r["source"]
                and r["num_gpus"] == H100_FIT_GPUS)


def fitted_efficiency(hardware):
    """Re-derive the default efficiency of ``hardware`` from the rows FITS names."""
    if hardware == "A100-80GB":
        return fit_gemm(hardware)[0]
    if hardware == "H100-80GB":
        r = h100_fit_row()
        return pl.calibrate(r["model"], r["layout"], r["batch_size"], hardware,
                            r["published"] * pl.HARDWARE[hardware].peak_flops,
                            convention=r["metric"], recompute=r["recompute"],
                            dp_overlap=r["dp_overlap"])
    if hardware == "V100-DGX-2H":
        base = shoeybi2019()[0]
        return pl.calibrate(base["model"], pl.Layout(), 8, hardware, 39e12,
                            convention="hardware", recompute="full")
    raise ValueError(f"{hardware}'s efficiency is not fitted (see FITS)")


def compare_narayanan(calibrate_on=None, hardware="A100-80GB"):
    """Every row of Narayanan et al.'s Table 1 predicted with the hardware's fitted constants
    (fitted to these same rows: an in-sample check of the model's form), or, with
    ``calibrate_on=i``, with the efficiency calibrated on row i alone (marked ``fitted``)."""
    rows = narayanan2021()
    eff = None
    if calibrate_on is not None:
        ref = rows[calibrate_on]
        eff = pl.calibrate(ref["model"], ref["layout"], ref["batch_size"], hardware,
                           ref["tflops_per_gpu"] * 1e12, convention="hardware", recompute="full")
    out = []
    for i, r in enumerate(rows):
        pred = pl.predict(r["model"], r["layout"], r["batch_size"], hardware, eff, "full")
        out.append(dict(params_billion=r["params_billion"], layout=r["layout"],
                        published=r["tflops_per_gpu"], predicted=pred.hardware_tflops_per_gpu,
                        error=pred.hardware_tflops_per_gpu / r["tflops_per_gpu"] - 1,
                        efficiency=pl.get_hardware(hardware).efficiency if eff is None else eff,
                        fitted=calibrate_on is None or i == calibrate_on, prediction=pred))
    return out


def compare_shoeybi(hardware="V100-DGX-2H", batch_per_replica=8, baseline_tflops=39.0):
    """Weak-scaling efficiency predicted vs Figure 5, calibrated on the 1-GPU baseline."""
    rows = shoeybi2019()
    base = rows[0]
    eff = pl.calibrate(base["model"], pl.Layout(), batch_per_replica, hardware,
                       baseline_tflops * 1e12, convention="hardware", recompute="full")
    out = []
    for r in rows:
        for gpus, published, dp in ((r["mp"], r["mp_eff"], 1),
                                    (r["mpdp_gpus"], r["mpdp_eff"], r["mpdp_gpus"] // r["mp"])):
            layout = pl.Layout(dp=dp, tp=r["mp"])
            pred = pl.predict(r["model"], layout, batch_per_replica * dp, hardware, eff, "full")
            predicted = pred.hardware_flops_per_gpu / (baseline_tflops * 1e12)
            out.append(dict(params_billion=r["params_billion"], gpus=gpus, layout=layout,
                            published=published, predicted=predicted,
                            error=predicted - published))
    return out


# ---- runs of 2022-2024, never used for fitting ---------------------------------------------

def _field(r, key, cast, default=None):
    return cast(r[key]) if r.get(key, "").strip() else default


def _flag(r, key, default):
    value = r.get(key, "").strip().lower()
    return default if not value else value == "true"


# Rules for what a source does not print (data/published/README.md; fixed before predicting)
PRE_SEQUENCE_PARALLEL = ("smith2022", "bigscience2022", "korthikanti2022_abstract")
ZERO = {"bigscience2022": 1, "dubey2024": 2}      # stated: BLOOM's ZeRO-1, Llama 3's FSDP
LLAMA3_STAGES = (7,) + (8,) * 14 + (7,)          # one layer fewer on the first and last stage
LLAMA3_CHUNKS = 8        # one layer per model chunk (Sec. 3.3.2: see ``_llama3``)
# Megatron-LM from 2022 sends the backward's TP collectives during the weight gradients
TP_OVERLAP = ("korthikanti2022", "jiang2024")


def runs_2022_2024():
    """The rows of ``runs_2022_2024.csv`` whose layout is complete enough to predict, as dicts
    with a Transformer, a Layout, the batch, the metric and its value. Left out: OPT-175B and
    the Megatron-LM README rows (no layout given), Llama 3's 128K row (its printed DP does not
    fit its GPU count), and MegaScale's own system (not a standard transformer block).
    Unprinted inputs follow the README's rules: sequence parallelism where the stack had it
    (not MT-NLG, BLOOM, nor Korthikanti et al.'s no-SP baseline), no interleaving unless
    stated, micro-batch 1, selective recomputation (Megatron-LM's default since 2022), ZeRO 0,
    fp32 main gradients; Llama 3 as its Sec. 3.3.2 describes it (see ``_llama3``)."""
    out = []
    for r in _read("runs_2022_2024.csv"):
        src = r["source"]
        if "megascale_t2_megascale" in src or "fig9_megascale" in src or "128K" in src:
            continue
        needed = ("num_layers", "hidden_size", "num_attention_heads", "tensor_parallel",
                  "pipeline_parallel", "data_parallel", "global_batch_size", "seq_len")
        if any(not r[k].strip() for k in needed) or int(r["seq_len"]) > 8192:
            continue
        h, heads = int(r["hidden_size"]), int(r["num_attention_heads"])
        model = pl.Transformer(int(r["num_layers"]), h, heads, int(r["seq_len"]),
                               _field(r, "vocab_size", int, 51200),
                               _field(r, "ffn_hidden_size", int), _field(r, "num_kv_heads", int),
                               _flag(r, "tied_embeddings", True), _flag(r, "gated_mlp", False))
        tp, pp = int(r["tensor_parallel"]), int(r["pipeline_parallel"])
        sp = _flag(r, "sequence_parallel", tp > 1 and not src.startswith(PRE_SEQUENCE_PARALLEL))
        layout = pl.Layout(int(r["data_parallel"]), tp, pp, ZERO.get(src.split("_")[0], 0),
                           _field(r, "micro_batch_size", int, 1),
                           _field(r, "virtual_stages", int, 1), sp,
                           _field(r, "context_parallel", int, 1), grad_bytes=4,
                           tp_overlap=src.startswith(TP_OVERLAP))
        # what the source reports: MFU (model FLOPs), HFU, or TFLOP/s in its stated convention
        if r["mfu_percent"].strip():
            metric, value = "model", float(r["mfu_percent"]) / 100
        elif r["hfu_percent"].strip():
            metric, value = "hardware", float(r["hfu_percent"]) / 100
        else:
            hw = pl.get_hardware(_gpu(r["gpu"]))
            metric = r["flops_convention"] or "hardware"
            value = float(r["tflops_per_gpu"]) * 1e12 / hw.peak_flops
        recompute = r["recompute"] or "selective"
        if "llama3" in src:
            layout, recompute = _llama3(layout), "selective"
            model = dataclasses.replace(model, dropout=False)
        out.append(dict(source=src, name=r["model"], num_gpus=int(r["num_gpus"]), model=model,
                        layout=layout, batch_size=int(r["global_batch_size"]),
                        hardware=_gpu(r["gpu"]), recompute=recompute,
                        metric=metric, published=value,
                        # FSDP's asynchronous reduce-scatters: stated by Llama 3 only
                        dp_overlap=1.0 if "llama3" in src else 0.0))
    return out


def _llama3(layout):
    """Llama 3 (Sec. 3.3.2): an interleaved schedule with one layer fewer on the first and
    last stages, after which "the first model chunk on the first stage has only the
    embedding": so each chunk held one layer, 8 chunks per rank (``LLAMA3_CHUNKS``); FSDP
    that "shards optimizer states and gradients" but keeps the weights whole (ZeRO-2, fp32
    gradients); FlashAttention, whose backward recomputes the scores ("without activation
    checkpointing" stores everything else: the planner's "selective" with flash_attention);
    no dropout (``runs_2022_2024`` sets ``dropout=False`` on the model)."""
    return dataclasses.replace(layout, stage_layers=LLAMA3_STAGES, sequence_parallel=True,
                               virtual_stages=LLAMA3_CHUNKS, flash_attention=True)


def _gpu(name):
    return "A100-80GB" if name == "A100" else name


def source_of(row):
    """The paper a row comes from (its source key's first word): errors are grouped by it."""
    return row["source"].split("_")[0]


def baseline_rates():
    """The constant baseline's hardware-FLOP rate (fraction of peak) per GPU, from the same
    rows as the planner's fits: the mean of Narayanan et al.'s ten rows for the A100, the
    fitted Llama 3 row for the H100."""
    a100 = [r["tflops_per_gpu"] * 1e12 / pl.HARDWARE["A100-80GB"].peak_flops
            for r in narayanan2021()]
    r = h100_fit_row()
    m = r["model"]
    h100 = r["published"] * m.iteration_flops(1, r["recompute"]) / m.iteration_flops(1, "none")
    return {"A100-80GB": sum(a100) / len(a100), "H100-80GB": h100}


def validate():
    """Every 2022-2024 row predicted with the hardware's fitted constants, beside a constant
    baseline that runs every job at its GPU's ``baseline_rates()`` hardware FLOP rate, in the
    row's own convention (MFU = that rate x the row's model / hardware FLOPs). Fractions of
    peak; error = predicted/published - 1; ``fitted`` marks the row the H100 was fitted to;
    ``fits``: whether the layout fits in the GPU's usable memory."""
    base = baseline_rates()
    fit_row = h100_fit_row()
    out = []
    for r in runs_2022_2024():
        pred = pl.predict(r["model"], r["layout"], r["batch_size"], r["hardware"],
                          recompute=r["recompute"], dp_overlap=r["dp_overlap"])
        peak = pl.get_hardware(r["hardware"]).peak_flops
        got = (pred.flops_per_gpu if r["metric"] == "model" else pred.hardware_flops_per_gpu)
        m = r["model"]
        rate = base[r["hardware"]]
        constant = (rate * m.iteration_flops(1, "none") / m.iteration_flops(1, r["recompute"])
                    if r["metric"] == "model" else rate)
        out.append(dict(r, predicted=got / peak, error=got / peak / r["published"] - 1,
                        constant=constant, constant_error=constant / r["published"] - 1,
                        prediction=pred, fits=pred.fits, memory=pred.memory,
                        fitted=r["source"] == fit_row["source"]
                        and r["num_gpus"] == fit_row["num_gpus"]))
    return out


def error_table(rows=None):
    """Mean absolute error of the planner and of the constant baseline on the held-out rows,
    per source and overall: {source: (rows, planner, baseline)}, "all" last."""
    rows = [r for r in (validate() if rows is None else rows) if not r["fitted"]]
    table = {}
    for key in dict.fromkeys(source_of(r) for r in rows):
        group = [r for r in rows if source_of(r) == key]
        table[key] = (len(group), sum(abs(r["error"]) for r in group) / len(group),
                      sum(abs(r["constant_error"]) for r in group) / len(group))
    table["all"] = (len(rows), sum(abs(r["error"]) for r in rows) / len(rows),
                    sum(abs(r["constant_error"]) for r in rows) / len(rows))
    return table


def llama3_interleave_range(num_gpus=16384, depths=range(1, LLAMA3_CHUNKS + 1)):
    """Llama 3's interleaving depth is not printed as a number (Sec. 3.3.2's first model chunk
    implies ``LLAMA3_CHUNKS``): for each v from 1 to it, refit the H100's efficiency to the 8,192-GPU row and predict the
    ``num_gpus`` row. {v: (efficiency, error)}: the prediction's range over the unknown."""
    fit, test = h100_fit_row(), next(r for r in runs_2022_2024() if "llama3" in r["source"]
                                    and r["num_gpus"] == num_gpus)
    hw = pl.get_hardware(fit["hardware"])
    out = {}
    for v in depths:
        f, t = (dataclasses.replace(r["layout"], virtual_stages=v) for r in (fit, test))
        eff = pl.calibrate(fit["model"], f, fit["batch_size"], hw, fit["published"] * hw.peak_flops,
                           convention=fit["metric"], recompute=fit["recompute"],
                           dp_overlap=fit["dp_overlap"])
        pred = pl.predict(test["model"], t, test["batch_size"], hw, eff, test["recompute"],
                          test["dp_overlap"])
        out[v] = (eff, pred.flops_per_gpu / hw.peak_flops / test["published"] - 1)
    return out
