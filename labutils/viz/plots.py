"""Generic plots of measurements: bars and curves with error bars from ``lu.timing.Stats``.

Used by 04a (step time per DDP version), 04b (bytes vs accuracy per comm hook), 04c (speedup and
efficiency curves, bucket sweeps) and any lab that compares timings. Every figure shows the
median with a bar from min to max, because one timing on a shared laptop means little.
"""
from __future__ import annotations

from labutils.core.i18n import tr
from labutils.core.timing import Stats
from labutils.viz.style import MIN_POINTS


def _mid_err(values, scale=1.0):
    """Medians and asymmetric (below, above) error lengths of Stats (or plain numbers)."""
    mids, below, above = [], [], []
    for v in values:
        if isinstance(v, Stats):
            mids.append(v.median * scale)
            below.append((v.median - v.min) * scale)
            above.append((v.max - v.median) * scale)
        else:
            mids.append(float(v) * scale)
            below.append(0.0)
            above.append(0.0)
    return mids, [below, above]


def _axes(ax, figsize=(6, 3.5)):
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def plot_bars(values, ax=None, ylabel="", title="", scale=1.0, annotate="{:.3g}", color=None):
    """Bar chart of ``{label: Stats or number}``: median bars with min-max whiskers."""
    ax = _axes(ax)
    labels = list(values)
    mids, err = _mid_err(values.values(), scale)
    ax.bar(range(len(labels)), mids, yerr=err, capsize=4, color=color or "tab:blue",
           edgecolor="black", linewidth=0.5)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=0 if len(labels) < 6 else 30)
    if annotate:   # the median, above the whisker so that the two never overlap
        for i, m in enumerate(mids):
            ax.annotate(annotate.format(m), (i, m + err[1][i]), ha="center", va="bottom",
                        fontsize=MIN_POINTS, xytext=(0, 2), textcoords="offset points")
        top = max((m + e for m, e in zip(mids, err[1])), default=0.0)
        if top > 0:   # room above the highest label: it never touches the frame
            ax.set_ylim(top=max(ax.get_ylim()[1], 1.15 * top))
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return ax


def plot_lines(x, series, ax=None, xlabel="", ylabel="", title="", scale=1.0, logx=False,
               logy=False, ideal=None, markers="os^vD", ideal_label=None):
    """Curves ``{label: [Stats or number per x]}`` with min-max error bars; ``ideal`` adds a
    dashed reference curve (a list of numbers, or a function of x), named ``ideal_label``."""
    ax = _axes(ax)
    for i, (label, values) in enumerate(series.items()):
        mids, err = _mid_err(values, scale)
        ax.errorbar(x, mids, yerr=err, marker=markers[i % len(markers)], capsize=3, label=label)
    if ideal is not None:
        ys = [ideal(v) for v in x] if callable(ideal) else ideal
        ax.plot(x, ys, "k--", linewidth=1, label=tr("ideal") if ideal_label is None
                else ideal_label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    return ax


def speedup(times_by_world_size, baseline=1):
    """``{world_size: Stats of time per unit of work}``, timed in paired rounds (round i of
    every world size ran side by side) -> ``{world_size: Stats of speedup}`` relative to
    ``baseline``: the per-round ratios baseline_i / t_i."""
    base = times_by_world_size[baseline].values
    return {p: Stats.of([b / x for b, x in zip(base, t.values, strict=True)], t.rounds)
            for p, t in times_by_world_size.items()}


def efficiency(speedups, baseline=1):
    """Speedup divided by the number of ranks relative to the baseline (1.0 is perfect)."""
    out = {}
    for p, s in speedups.items():
        k = p / baseline
        out[p] = (Stats(s.median / k, s.min / k, s.max / k, tuple(v / k for v in s.values))
                  if isinstance(s, Stats) else s / k)
    return out


def plot_scaling(times_by_world_size, ax=None, title="", weak=False, ideal=None):
    """Speedup (strong scaling) or efficiency (weak scaling) against world size, with error
    bars and the ideal line. ``times_by_world_size``: ``{p: Stats}`` of time per step.
    ``ideal``: the ideal speedup as a function of p (default p over the baseline's p; pass
    the cores' limit when ranks share fewer cores than p)."""
    ps = sorted(times_by_world_size)
    s = speedup(times_by_world_size, baseline=ps[0])
    if weak:  # the work grows with p: ideal time stays flat, efficiency = t(1) / t(p)
        ax = plot_lines(ps, {tr("efficiency"): [s[p] for p in ps]}, ax=ax, xlabel=tr("ranks"),
                        ylabel=tr("efficiency  t(1)/t(p)"), title=title,
                        ideal=ideal or [1.0] * len(ps))
    else:
        ax = plot_lines(ps, {tr("speedup"): [s[p] for p in ps]}, ax=ax, xlabel=tr("ranks"),
                        ylabel=tr("speedup  t(1)/t(p)"), title=title,
                        ideal=ideal or (lambda p: p / ps[0]))
    ax.set_xticks(ps)   # rank counts are whole numbers
    return ax
