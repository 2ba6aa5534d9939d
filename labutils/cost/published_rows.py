"""Published training runs as the planner's inputs: each paper's rows read from
``data/published/*.csv`` and encoded as a ``Transformer``, a ``Layout``, the batch, the GPU and
the published value, with the rules for what a source does not print (data/published/README.md,
fixed before any prediction). ``labutils.cost.published`` fits the planner's constants to some
of these rows and measures its error on the others.
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
    stated (MT-NLG's DeepSpeed pipeline engine has only the plain 1F1B schedule), micro-batch
    1, selective recomputation (Megatron-LM's default since 2022), ZeRO 0, fp32 main gradients
    (stored and reduced); Llama 3 as its Sec. 3.3.2 describes it (see ``_llama3``)."""
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
    """Llama 3 as Dubey et al. 2024 print it (Sec. 3.3.2 unless said): "one Transformer layer"
    fewer on the first and the last stage (``LLAMA3_STAGES``); an interleaved schedule after
    which "the first model chunk on the first stage has only the embedding", so a chunk holds
    one layer: v = 8 (``LLAMA3_CHUNKS``; ``published.unknown_ranges`` reports v = 1, 2, 4 too);
    FSDP that shards "optimizer states and gradients" but does not reshard the weights after
    forward (ZeRO-2), reducing gradients "in FP32" (grad_bytes=4) and asynchronously
    (dp_overlap=1, set in ``runs_2022_2024``); no activation checkpointing at 8K tokens, which
    the s^2 attention scores of 128 heads would forbid (2.1 GB per layer and micro-batch on one
    TP rank), so attention runs tiled (flash_attention, its backward recomputing the scores:
    the planner's "selective"); no dropout (the architecture of Table 3 has none)."""
    return dataclasses.replace(layout, stage_layers=LLAMA3_STAGES, sequence_parallel=True,
                               virtual_stages=LLAMA3_CHUNKS, flash_attention=True)


def _gpu(name):
    return "A100-80GB" if name == "A100" else name


def source_of(row):
    """The paper a row comes from (its source key's first word): errors are grouped by it."""
    return row["source"].split("_")[0]

