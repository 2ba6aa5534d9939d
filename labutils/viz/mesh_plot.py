"""The device mesh of a ``ParallelDims`` layout drawn (06e_composed_parallelism): each rank a box
at its (pp, dp, tp) place, each group a line through its members (pp groups as arcs, one depth per
tp rank, so that no two cross the same ranks), one rank's groups in bold."""
from __future__ import annotations

from labutils.core.i18n import tr
from labutils.viz.style import fit_width
GROUP_COLORS = {"tp": "tab:red", "dp": "tab:blue", "pp": "tab:green", "cp": "tab:purple"}


def _place(c, dims):
    """x: pipeline stages side by side, tensor-parallel ranks next to each other inside one;
    y: data (and context) parallel replicas one under another."""
    return c.pp_rank * (dims.tp + 1.2) + c.tp_rank, -(c.dp_rank * dims.cp + c.cp_rank)


def _arcs(points, tp_rank, n=20):
    """x, y of arcs joining consecutive ``points`` below them, ``0.3 + 0.18 * tp_rank`` deep."""
    import numpy as np
    xs, ys, depth = [], [], 0.3 + 0.18 * tp_rank
    for (x0, y0), (x1, _) in zip(points, points[1:]):
        t = np.linspace(0, 1, n)
        xs += list(x0 + (x1 - x0) * t)
        ys += list(y0 - 0.2 - depth * np.sin(np.pi * t))
    return xs, ys


def plot_mesh(dims, rank=None, ax=None):
    """Draw every rank of ``dims`` and every group along each dimension of size > 1; the
    groups of ``rank`` (if given) are drawn thick and the rank itself filled."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=fit_width(2.2 * dims.pp * (dims.tp + 1),
                                             1.3 * dims.dp * dims.cp + 1.4),
                             layout="constrained")
    where = {r: _place(dims.coords(r), dims) for r in range(dims.world_size)}
    mine = dims.groups(rank) if rank is not None else {}
    offsets = {"tp": (0, 0.28), "dp": (-0.28, 0), "cp": (0.28, 0), "pp": (0, -0.28)}
    for dim, color in GROUP_COLORS.items():
        if getattr(dims, dim) == 1:
            continue
        dx, dy = offsets[dim]
        for group in dims.all_groups(dim):
            if dim == "pp":   # straight, the pp groups of one row would run through each other
                xs, ys = _arcs([where[r] for r in group], dims.coords(group[0]).tp_rank)
            else:
                xs = [where[r][0] + dx for r in group]
                ys = [where[r][1] + dy for r in group]
            bold = mine.get(dim) == group
            ax.plot(xs, ys, "-" if dim == "pp" else "-o", color=color, lw=4 if bold else 1.2,
                    ms=4,
                    alpha=1.0 if bold or rank is None else 0.45,
                    label=tr("{dim} group", dim=dim) if group == dims.all_groups(dim)[0]
                    else None)
    for r, (x, y) in where.items():
        ax.text(x, y, str(r), ha="center", va="center", fontsize=12, zorder=3,
                bbox={"boxstyle": "round", "fc": "gold" if r == rank else "white", "ec": "black"})
    for s in range(dims.pp):
        ax.text(s * (dims.tp + 1.2) + (dims.tp - 1) / 2, 0.75, tr("stage pp={s}", s=s), ha="center",
                fontsize=10)
    ax.set_xlim(-0.8, dims.pp * (dims.tp + 1.2) - 0.4)
    ax.set_ylim(-(dims.dp * dims.cp) + 0.2 - 0.18 * dims.tp, 1.1)
    ax.set_axis_off()
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    title = f"ParallelDims(dp={dims.dp}, tp={dims.tp}, pp={dims.pp}, cp={dims.cp})"
    ax.set_title(title + (tr(": the groups of rank {rank} in bold", rank=rank)
                          if rank is not None else ""))
    return ax
