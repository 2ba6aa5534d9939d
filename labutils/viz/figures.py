"""The labs' own figures: collectives drawn rank by rank, all-reduce times with their fits,
async SGD runs, a pipeline sweep, a memory breakdown, emulated-link speedups."""
from labutils.core.memory import TERMS
from labutils.core.i18n import label, tr
from labutils.viz.style import MIN_POINTS, WIDTH, fit_width


def _draw_ranks(ax, values, title):
    import numpy as np
    width = max(1, max(len(v) for v in values))
    grid = np.full((len(values), width), np.nan)
    for r, v in enumerate(values):
        grid[r, :len(v)] = v
    image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=np.nanmax(np.abs(grid)) if np.any(
        np.isfinite(grid)) else 1, aspect="auto")
    for r, v in enumerate(values):
        for i, val in enumerate(v):   # dark text on viridis' light end, white on its dark end
            light = image.norm(val) > 0.6
            ax.text(i, r, f"{val:g}", ha="center", va="center", fontsize=MIN_POINTS,
                    color="black" if light else "white")
    ax.set_yticks(range(len(values)), [f"rank {r}" for r in range(len(values))])
    ax.set_xticks([])
    ax.set_title(title, fontsize="medium")


def plot_collectives(results, columns=2):
    """A grid: for each collective, every rank's tensor before (left) and after (right)."""
    import matplotlib.pyplot as plt
    names = list(results)
    rows = -(-len(names) // columns)
    fig, axes = plt.subplots(rows, 2 * columns, figsize=fit_width(3.2 * columns * 2, 1.9 * rows),
                             squeeze=False)
    for k, name in enumerate(names):
        r, c = divmod(k, columns)
        before, after = results[name]
        _draw_ranks(axes[r][2 * c], before, tr("{name}: before", name=name))
        _draw_ranks(axes[r][2 * c + 1], after, tr("{name}: after", name=name))
    for k in range(len(names), rows * columns):
        r, c = divmod(k, columns)
        axes[r][2 * c].axis("off"), axes[r][2 * c + 1].axis("off")
    fig.tight_layout()
    return fig


def plot_all_reduce_times(sizes, stats, world_size, fits=None, ax=None, title=None):
    """Time (median, min-max bars) against bytes on log axes; ``fits``: {label: seconds};
    ``title`` replaces "all-reduce on p ranks" (say "emulated link" when it was). The legend
    sits below the axes, in two columns: inside, it covered the points it names."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    colors = {}
    for impl, st in stats.items():
        med = [s.median for s in st]
        err = [[m - s.min for m, s in zip(med, st)], [s.max - m for m, s in zip(med, st)]]
        drawn = ax.errorbar(sizes, med, yerr=err, marker="o", capsize=3,
                            label=tr("{impl} (measured)", impl=impl))
        colors[impl] = drawn.lines[0].get_color()
    for label, secs in (fits or {}).items():   # a fit named after an algorithm: its colour
        color = next((c for impl, c in colors.items() if label.startswith(impl)), None)
        ax.plot(sizes, secs, "--", color=color, label=label)
    ax.set_xscale("log", base=2), ax.set_yscale("log")
    ax.set_xlabel(tr("message size (bytes)")), ax.set_ylabel(tr("all-reduce time (s)"))
    ax.set_title(title or tr("all-reduce on {world_size} ranks", world_size=world_size))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
    return ax


def plot_runs(runs, axes=None):
    """Loss against examples processed (left) and against wall time (right)."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(WIDTH, 3.4))
    for run in runs:
        axes[0].plot(run["examples"], run["loss"], marker=".", label=run["name"])
        if "time" in run:
            axes[1].plot(run["time"], run["loss"], marker=".", label=run["name"])
    axes[0].set_xlabel(tr("examples processed (all workers)"))
    axes[1].set_xlabel(tr("wall time (s)"))
    for ax in axes:
        ax.set_ylabel(tr("training loss")), ax.legend()
    return axes


def plot_sweep(rows, title=""):
    """Two panels: bubble and throughput against m, measured (dots) vs predicted (line)."""
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(WIDTH, 3.2))
    ms = [r["m"] for r in rows]
    for ax, key, name in ((ax1, "bubble", tr("bubble fraction")),
                          (ax2, "throughput", tr("throughput (samples/s)"))):
        ax.plot(ms, [r[f"predicted_{key}"] for r in rows], "-", label=tr("predicted"))
        ax.plot(ms, [r[f"measured_{key}"] for r in rows], "o", label=tr("measured"))
        ax.set_xscale("log", base=2)
        ax.set_xlabel(tr("micro-batches m"))
        ax.set_ylabel(name)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_memory(estimates, measured=None, ax=None, unit=2 ** 20, unit_name="MiB"):
    """Stacked bars of the formula's terms, one bar per label; measured peaks as markers.

    ``estimates``: {label: model_memory dict}; ``measured``: {label: peak bytes} or None.
    """
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=fit_width(1.6 + 1.4 * len(estimates), 3.2))
    labels = list(estimates)
    bottom = [0.0] * len(labels)
    for term in TERMS:
        vals = [estimates[k][term] / unit for k in labels]
        ax.bar(labels, vals, bottom=bottom, label=label(term))
        bottom = [b + v for b, v in zip(bottom, vals)]
    if measured:
        ax.scatter([k for k in labels if k in measured], [measured[k] / unit for k in labels
                   if k in measured], color="black", marker="_", s=900, linewidths=2.5,
                   label=tr("measured peak"), zorder=3)
    ax.set_ylabel(unit_name)
    ax.legend()
    return ax


def plot_emulated_ddp(rows, ax=None, world_size=2):
    """Speedup against link bandwidth: one colour per variant, measured points over the cost
    model's lines, the ideal dotted."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(6.5, 3.6))[1]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    for i, name in enumerate(variants):
        rs = [r for r in rows if r["variant"] == name]
        gbps = [r["gbps"] for r in rs]
        color = f"C{i}"
        ax.plot(gbps, [r["predicted"] for r in rs], "-", color=color, alpha=0.6)
        lo = [world_size * r["compute"].median / r["step"].max for r in rs]
        hi = [world_size * r["compute"].median / r["step"].min for r in rs]
        mid = [r["measured"] for r in rs]
        ax.errorbar(gbps, mid, yerr=[[m - a for m, a in zip(mid, lo)],
                                     [b - m for m, b in zip(mid, hi)]],
                    fmt="o", color=color, capsize=3, label=label(name))
    ax.axhline(world_size, color="gray", ls=":",
               label=tr("ideal: {world_size} ranks", world_size=world_size))
    ax.set_xscale("log")
    ticks = dict((r["link"], r["gbps"]) for r in rows)
    ax.set_xticks(list(ticks.values()), [label(link) for link in ticks])
    ax.minorticks_off()
    ax.set(xlabel=tr("emulated link"), ylabel=tr("speedup over 1 rank"),
           title=tr("DDP on emulated links: measured (points) and cost model (lines)"),
           ylim=(0, world_size * 1.1))
    ax.legend(loc="lower right")
    return ax
