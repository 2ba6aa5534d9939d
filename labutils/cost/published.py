"""Published training runs, and how far the planner's predictions are from them.

Every row comes from a paper's table (``data/published/*.csv``, each with its citation and
uncertainty). The planner has three fitted constants, the default ``efficiency`` of A100, V100
and (by assumption, not by fit) H100 in ``labutils.cost.planspec.HARDWARE``; ``FITS`` says which one
row each was fitted to, and ``fitted_efficiency`` re-derives it. Every other row is held out:
``validate`` reports the planner's error on them beside a baseline that predicts the fitted
row's per-GPU throughput for every row of the same GPU.
"""
from __future__ import annotations

import csv
import os

from labutils.core.env import ROOT
from labutils.cost import planner as pl

DATA = os.path.join(ROOT, "data", "published")


def _read(name):
    with open(os.path.join(DATA, name)) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def narayanan2021():
    """Narayanan et al. 2021, Table 1, as dicts with a Transformer, a Layout, the batch size
    and the published TFLOP/s per GPU (hardware FLOPs: full recomputation counted, eq. 3)."""
    rows = []
    for r in _read("narayanan2021_table1.csv"):
        model = pl.Transformer(int(r["num_layers"]), int(r["hidden_size"]),
                               int(r["attention_heads"]), 2048, 51200)
        tp, pp, n = int(r["tensor_parallel"]), int(r["pipeline_parallel"]), int(r["num_gpus"])
        rows.append(dict(source="Narayanan et al. 2021, Table 1",
                         name=f"GPT {float(r['params_billion']):g}B",
                         params_billion=float(r["params_billion"]), model=model,
                         layout=pl.Layout(n // (tp * pp), tp, pp), batch_size=int(r["batch_size"]),
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


# hardware -> (the one row its efficiency is fitted to); H100 has none (it takes A100's)
FITS = {"A100-80GB": ("Narayanan et al. 2021, Table 1", "GPT 145.6B"),
        "V100-DGX-2H": ("Shoeybi et al. 2019", "1.2B on one GPU, 39 TFLOP/s")}


def fitted_efficiency(hardware):
    """Re-derive the default efficiency of ``hardware`` from its one fitted row."""
    if hardware == "A100-80GB":
        ref = narayanan2021()[6]
        return pl.calibrate(ref["model"], ref["layout"], ref["batch_size"], hardware,
                            ref["tflops_per_gpu"] * 1e12, convention="hardware",
                            recompute="full")
    if hardware == "V100-DGX-2H":
        base = shoeybi2019()[0]
        return pl.calibrate(base["model"], pl.Layout(), 8, hardware, 39e12,
                            convention="hardware", recompute="full")
    raise ValueError(f"{hardware}'s efficiency is not fitted (see FITS)")


def compare_narayanan(calibrate_on=6, hardware="A100-80GB"):
    """Calibrate ``efficiency`` on one row (default: 145.6 B, the middle of the table and the
    first to use data, tensor and pipeline parallelism at once), predict every row; the
    calibration row is marked ``fitted`` (its error is 0 by construction)."""
    rows = narayanan2021()
    ref = rows[calibrate_on]
    eff = pl.calibrate(ref["model"], ref["layout"], ref["batch_size"], hardware,
                       ref["tflops_per_gpu"] * 1e12, convention="hardware", recompute="full")
    out = []
    for i, r in enumerate(rows):
        pred = pl.predict(r["model"], r["layout"], r["batch_size"], hardware, eff, "full")
        out.append(dict(params_billion=r["params_billion"], layout=r["layout"],
                        published=r["tflops_per_gpu"], predicted=pred.hardware_tflops_per_gpu,
                        error=pred.hardware_tflops_per_gpu / r["tflops_per_gpu"] - 1,
                        efficiency=eff, fitted=i == calibrate_on, prediction=pred))
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


def runs_2022_2024():
    """The rows of ``runs_2022_2024.csv`` whose layout is complete enough to predict, as dicts
    with a Transformer, a Layout, the batch, the metric and its value. Left out: OPT-175B and
    the Megatron-LM README rows (no layout given), Llama 3's 128K row (its printed DP does not
    fit its GPU count), and MegaScale's own system (not a standard transformer block)."""
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
        tp = int(r["tensor_parallel"])
        layout = pl.Layout(int(r["data_parallel"]), tp, int(r["pipeline_parallel"]), 0,
                           _field(r, "micro_batch_size", int, 1),
                           _field(r, "virtual_stages", int, 1),
                           _flag(r, "sequence_parallel", tp > 1),
                           _field(r, "context_parallel", int, 1))
        # what the source reports: MFU (model FLOPs), HFU, or TFLOP/s in its stated convention
        if r["mfu_percent"].strip():
            metric, value = "model", float(r["mfu_percent"]) / 100
        elif r["hfu_percent"].strip():
            metric, value = "hardware", float(r["hfu_percent"]) / 100
        else:
            hw = pl.get_hardware(_gpu(r["gpu"]))
            metric = r["flops_convention"] or "hardware"
            value = float(r["tflops_per_gpu"]) * 1e12 / hw.peak_flops
        # Unstated recomputation: "selective", Megatron-LM's default since 2022. Llama 3 trained
        # "without activation checkpointing" but with FlashAttention, whose backward recomputes
        # the attention scores instead of storing them: the planner's "selective".
        recompute = r["recompute"] or "selective"
        if "llama3" in src and recompute == "none":
            recompute = "selective"
        out.append(dict(source=src, name=r["model"], num_gpus=int(r["num_gpus"]), model=model,
                        layout=layout, batch_size=int(r["global_batch_size"]),
                        hardware=_gpu(r["gpu"]), recompute=recompute,
                        metric=metric, published=value))
    return out


def _gpu(name):
    return "A100-80GB" if name == "A100" else name


def validate():
    """Every held-out 2022-2024 row predicted with the hardware's default efficiency, beside a
    constant baseline: every run at the fitted A100 row's hardware FLOP rate (47% of peak),
    expressed in the row's own convention (MFU = that rate x the row's model / hardware FLOPs,
    which depends on its recomputation). Fractions of peak; error = predicted/published - 1."""
    ref = narayanan2021()[6]
    hfu = ref["tflops_per_gpu"] * 1e12 / pl.HARDWARE["A100-80GB"].peak_flops
    out = []
    for r in runs_2022_2024():
        pred = pl.predict(r["model"], r["layout"], r["batch_size"], r["hardware"],
                          recompute=r["recompute"])
        peak = pl.get_hardware(r["hardware"]).peak_flops
        got = (pred.flops_per_gpu if r["metric"] == "model" else pred.hardware_flops_per_gpu)
        m = r["model"]
        constant = (hfu * m.iteration_flops(1, "none") / m.iteration_flops(1, r["recompute"])
                    if r["metric"] == "model" else hfu)
        out.append(dict(r, predicted=got / peak, error=got / peak / r["published"] - 1,
                        constant=constant, constant_error=constant / r["published"] - 1,
                        prediction=pred))
    return out
