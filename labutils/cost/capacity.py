"""How many GPUs a training run needs: the planner's ``search`` at growing GPU counts until
the fastest layout trains a token budget within a time limit (07). The answer carries the
uncertainty of the planner's least certain input, its efficiency, taken out of sample: the
efficiency each held-out published row needs to be reproduced alone, as a ratio to its GPU's
fitted value (the rule is in data/published/README.md); the GPU counts and times the search
gives at the lowest and the highest of those.
"""
from __future__ import annotations

from labutils.cost import planner as pl
from labutils.cost import published as pub


def held_out_efficiency_ratios():
    """For every held-out 2022-2024 row, the efficiency that reproduces it alone over its GPU's
    fitted efficiency (1: the fit reproduces it). A row that no efficiency up to 100% of peak
    reproduces is left out."""
    out = []
    for r in pub.runs_2022_2024():
        hw = pl.get_hardware(r["hardware"])
        if pub.validate([r])[0]["fitted"]:
            continue
        try:
            eff = pl.calibrate(r["model"], r["layout"], r["batch_size"], hw,
                               r["published"] * hw.peak_flops, convention=r["metric"],
                               recompute=r["recompute"], dp_overlap=r["dp_overlap"])
        except ValueError:
            continue
        out.append(eff / hw.efficiency)
    return out


def efficiency_range(hardware):
    """(low, fitted, high) efficiency of ``hardware``: its fitted efficiency times the least and
    the most of ``held_out_efficiency_ratios`` (every GPU's rows pooled: the H100 has one
    held-out row, the V100 none), the high end capped at 100% of peak."""
    hw = pl.get_hardware(hardware)
    ratios = held_out_efficiency_ratios()
    return hw.efficiency * min(ratios), hw.efficiency, min(hw.efficiency * max(ratios), 1.0)


def node_counts(hardware, largest=65536):
    """GPU counts to try: one node, then doubling (8, 16, 32, ... on 8-GPU nodes)."""
    n, out = pl.get_hardware(hardware).gpus_per_node, []
    while n <= largest:
        out.append(n)
        n *= 2
    return out


def _first_that_finishes(model, tokens, seconds, hw, batch_size, efficiency, counts, kwargs):
    steps = tokens / (batch_size * model.seq_len)
    for n in counts:
        found = pl.search(model, n, batch_size, hw, efficiency, top=1, **kwargs)
        if found and steps * found[0].step.total <= seconds:
            return n, found[0]
    return None, None


def gpus_needed(model, tokens, seconds, hardware, batch_size, gpu_counts=None, **search_kwargs):
    """The fewest GPUs (from ``gpu_counts``, default ``node_counts``) whose fastest feasible
    layout trains ``tokens`` tokens, in batches of ``batch_size`` sequences, within
    ``seconds``. A dict: ``gpus`` and its ``prediction`` (a ``planner.Prediction``) and
    ``seconds`` at the fitted efficiency; ``seconds_range``, that layout's time at the highest
    and the lowest efficiency of ``efficiency_range``; ``gpus_range``, the fewest GPUs at those
    two efficiencies; and ``efficiency_range``. A count is None where no
    count tried is enough. ``search_kwargs`` go to ``planner.search``."""
    hw = pl.get_hardware(hardware)
    if tokens <= 0 or seconds <= 0 or batch_size < 1:
        raise ValueError(f"tokens and seconds must be > 0 and batch_size >= 1; got {tokens!r}, "
                         f"{seconds!r}, {batch_size!r}")
    counts = node_counts(hw) if gpu_counts is None else sorted(gpu_counts)
    low, fitted, high = efficiency_range(hw)
    args = (model, tokens, seconds, hw, batch_size)
    n, pred = _first_that_finishes(*args, fitted, counts, search_kwargs)
    few, _ = _first_that_finishes(*args, high, counts, search_kwargs)
    many, _ = _first_that_finishes(*args, low, counts, search_kwargs)
    steps = tokens / (batch_size * model.seq_len)
    spread = (None, None)
    if pred is not None:   # the same layout at the highest and the lowest efficiency
        spread = tuple(steps * pl.predict(model, pred.layout, batch_size, hw, e,
                                          pred.recompute).step.total for e in (high, low))
    return dict(gpus=n, prediction=pred, seconds=None if pred is None else steps * pred.step.total,
                seconds_range=spread, gpus_range=(few, many), efficiency_range=(low, high))
