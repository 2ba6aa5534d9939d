"""The planner's fitted constants, the rows they were fitted to, and how far its predictions
are from the published runs it was not fitted to.

The rows and the rules for what a source does not print are in
``labutils.cost.published_rows`` (re-exported here). The fitted constants are in
``labutils.cost.planspec.HARDWARE``: ``FITS`` says which rows each was fitted to (the A100's to
Narayanan et al.'s ten, the H100's and the V100's to one row each), ``fitted_efficiency``
re-derives them, ``constant_origins`` labels every constant (fitted, at a bound, datasheet,
borrowed). Every other row is held out: ``validate`` reports the planner's error on them beside
a baseline that predicts the fitting rows' per-GPU rate for every row of the same GPU;
``unknown_ranges`` repeats that over the plausible values of each unprinted input that matters.
"""
from __future__ import annotations

import dataclasses

from labutils.core.i18n import N_, tr
from labutils.cost import planner as pl
from labutils.cost.published_rows import (  # noqa: F401
    DATA,
    LLAMA3_CHUNKS,
    LLAMA3_STAGES,
    PRE_SEQUENCE_PARALLEL,
    TP_OVERLAP,
    ZERO,
    interleave_depth,
    narayanan2021,
    runs_2022_2024,
    shoeybi2019,
    source_of,
)


# Each fitted constant and the rows it was fitted to, named before any held-out prediction.
FITS = {
    "A100-80GB": ("efficiency (gemm_half_width and link_efficiency at their bounds)",
                  "Narayanan et al. 2021, Table 1",
                  "all ten rows (1.7B-1T)"),
    "H100-80GB": ("efficiency", "Dubey et al. 2024 (Llama 3), Table 4",
                  "405B on 8,192 GPUs"),
    "V100-DGX-2H": ("efficiency", "Shoeybi et al. 2019", "1.2B on one GPU, 39 TFLOP/s"),
}
H100_FIT_GPUS = 8192      # the Llama 3 row the H100's efficiency is fitted to


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


def validate(rows=None, h100_efficiency=None):
    """Every 2022-2024 row (``rows``, default ``runs_2022_2024()``) predicted with the
    hardware's fitted constants (the H100's efficiency replaced by ``h100_efficiency`` if
    given), beside a constant baseline that runs every job at its GPU's ``baseline_rates()``
    hardware FLOP rate, in the row's own convention (MFU = that rate x the row's model /
    hardware FLOPs). Fractions of peak; error = predicted/published - 1; ``fitted`` marks the
    row the H100 was fitted to; ``fits``: whether the layout fits in the GPU's usable memory."""
    base = baseline_rates()
    rows = runs_2022_2024() if rows is None else rows
    out = []
    for r in rows:
        eff = h100_efficiency if r["hardware"] == "H100-80GB" else None
        pred = pl.predict(r["model"], r["layout"], r["batch_size"], r["hardware"], eff,
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
                        fitted=_is_fit_row(r)))
    return out


def _is_fit_row(r):
    return "llama3" in r["source"] and r["num_gpus"] == H100_FIT_GPUS


def error_table(rows=None):
    """Mean absolute error of the planner and of the constant baseline on the held-out rows,
    per source and overall: {source: (rows, planner, baseline)}, "all" last."""
    rows = [r for r in (validate() if rows is None else rows) if not r["fitted"]]
    table = {}
    for key in dict.fromkeys(source_of(r) for r in rows):
        group = [r for r in rows if source_of(r) == key]
        table[key] = (len(group), sum(abs(r["error"]) for r in group) / len(group),
                      sum(abs(r["constant_error"]) for r in group) / len(group))
    table[N_("all")] = (len(rows), sum(abs(r["error"]) for r in rows) / len(rows),
                    sum(abs(r["constant_error"]) for r in rows) / len(rows))
    return table


def in_sample_table():
    """The same errors on the rows the constants were fitted to (a check of the form, not a
    test): {"narayanan2021": (10, planner, baseline), "dubey2024": (1, planner, baseline)},
    the baseline at its GPU's ``baseline_rates()`` (the fitting rows' own mean)."""
    rows = compare_narayanan()
    rate = baseline_rates()["A100-80GB"] * pl.HARDWARE["A100-80GB"].peak_flops / 1e12
    fit = next(r for r in validate([h100_fit_row()]))
    return {"narayanan2021": (len(rows), sum(abs(r["error"]) for r in rows) / len(rows),
                              sum(abs(rate / r["published"] - 1) for r in rows) / len(rows)),
            "dubey2024": (1, abs(fit["error"]), abs(fit["constant_error"]))}


# The unprinted inputs that move the held-out mean by more than half a point, and their
# plausible values (data/published/README.md lists those swept that move it less): the encoded
# value first.
UNKNOWNS = {
    N_("Llama 3 interleaving depth v"): ("llama3", "virtual_stages", (8, 4, 2, 1)),
    N_("MT-NLG micro-batch size"): ("smith2022", "micro_batch", (1, 2, 4)),
    N_("MegaScale's Megatron-LM micro-batch size"): ("jiang2024", "micro_batch", (1, 2)),
}


def unknown_ranges():
    """For each of ``UNKNOWNS``, for each plausible value: the rows re-encoded with it (the
    H100's efficiency refitted to its row when the value touches it), and the held-out
    ``error_table``. {unknown: {value: (h100_efficiency, table)}}; an efficiency of None
    means that no efficiency up to 100% of peak reproduces the fitting row: the planner is
    then run at that ceiling."""
    out = {}
    for name, (key, field_name, values) in UNKNOWNS.items():
        out[name] = {}
        for value in values:
            rows = [dict(r, layout=dataclasses.replace(r["layout"], **{field_name: value}))
                    if key in r["source"] else r for r in runs_2022_2024()]
            fit = next(r for r in rows if _is_fit_row(r))
            hw = pl.get_hardware(fit["hardware"])
            try:
                eff = pl.calibrate(fit["model"], fit["layout"], fit["batch_size"], hw,
                                   fit["published"] * hw.peak_flops, convention=fit["metric"],
                                   recompute=fit["recompute"], dp_overlap=fit["dp_overlap"])
                used = eff
            except ValueError:
                eff, used = None, pl._max_efficiency(hw, fit["model"], fit["layout"])
            out[name][value] = (eff, error_table(validate(rows, used)))
    return out


def constant_origins(hardware):
    """Where each of ``hardware``'s constants comes from: [(constant, value, origin)], origin
    "datasheet", "fitted to <rows>", "at its bound in the fit to <rows> (not supported)", or
    "borrowed from <GPU>"."""
    hw = pl.get_hardware(hardware)
    name = hw.name
    sheet = tr("datasheet")
    out = [(N_("peak FLOP/s"), hw.peak_flops, sheet), (N_("memory"), hw.memory, sheet),
           (N_("HBM bandwidth"), hw.hbm_bandwidth, sheet),
           (N_("links"), (hw.intra.name, hw.inter.name), sheet),
           (N_("memory reserve"), hw.memory - pl.usable_memory(hw),
            tr("allowance, not fitted"))]
    a100 = tr("Narayanan et al. 2021, Table 1: all ten rows")
    borrowed = tr("borrowed from {gpu}", gpu="A100-80GB")
    if name == "A100-80GB":
        bound = tr("at its bound in the fit to {rows}", rows=a100)
        out += [(N_("efficiency"), hw.efficiency, tr("fitted to {rows}", rows=a100)),
                ("gemm_half_width", hw.gemm_half_width, bound),
                ("link_efficiency", hw.link_efficiency, bound)]
    elif name in FITS:
        _, source, rows = FITS[name]
        other = (borrowed if name == "H100-80GB"
                 else tr("default, not fitted (no shape term, datasheet link rate)"))
        out += [(N_("efficiency"), hw.efficiency,
                 tr("fitted to {rows}", rows=f"{source}: {rows}")),
                ("gemm_half_width", hw.gemm_half_width, other),
                ("link_efficiency", hw.link_efficiency, other)]
    else:
        out += [(k, getattr(hw, k), borrowed)
                for k in (N_("efficiency"), "gemm_half_width", "link_efficiency")]
    return out
