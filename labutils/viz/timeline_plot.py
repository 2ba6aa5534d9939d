"""Per-rank timelines drawn as lanes of labelled bars (05, 06a1, 06a2), and DDP's compute and
communication overlap (04c)."""
import functools
import math

from labutils.core.i18n import N_, label, tr
from labutils.core.timeline import normalise
from labutils.viz.style import MIN_POINTS, WIDTH

# the names timelines draw in their legends (span names stay the English keys; label() shows them)
LEGEND_NAMES = (N_("forward"), N_("backward"), N_("compute"), N_("allreduce"), N_("comm"),
                N_("send"), N_("recv"), N_("wait"), N_("idle"), N_("optimizer"), N_("transfer"),
                N_("peer wait"), N_("queue"), N_("finished"), N_("pp recv"))
DEFAULT_COLORS = {"forward": "tab:blue", "backward": "tab:green", "compute": "tab:blue",
                  "allreduce": "tab:red", "comm": "tab:red", "send": "tab:orange",
                  "recv": "tab:orange", "wait": "lightgrey", "idle": "lightgrey",
                  "optimizer": "tab:purple", "transfer": "tab:red", "peer wait": "tab:pink"}
# drawn on a rank's communication lane by plot_overlap (one gloo thread: they never overlap)
COMM_NAMES = ("allreduce", "peer wait", "transfer")


def plot_timeline(spans, ax=None, colors=None, title="", unit="ms"):
    """Gantt chart: one row per rank, one bar per span, colour by name, label inside.

    Made to be projected in class: a label is drawn only where it fits inside its bar (decided
    each time the figure is drawn, so still right after ``tight_layout``, a resize or a zoom),
    the legend sits right of the axes, and the rank axis has ticks at whole ranks only."""
    import matplotlib.pyplot as plt
    spans = normalise(spans)
    colors = {**DEFAULT_COLORS, **(colors or {})}
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    ranks = sorted({s.rank for s in spans})
    if ax is None:   # constrained layout keeps the outside legend inside the figure
        _, ax = plt.subplots(figsize=(WIDTH, 0.6 * max(len(ranks), 1) + 1.2), layout="constrained")
    palette = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"])
    by_name = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
        if s.name not in colors:
            colors[s.name] = next(palette, "grey")
    labelled = []
    for name, group in by_name.items():   # one barh per kind: hundreds of spans draw fast
        bars = ax.barh([s.rank for s in group], [s.duration * scale for s in group],
                       left=[s.start * scale for s in group], height=0.7, color=colors[name],
                       edgecolor="black", linewidth=0.3)
        labelled += [(bar, s.label) for bar, s in zip(bars.patches, group) if s.label]
    _label_bars(ax, labelled)
    _legend_outside(ax, {n: colors[n] for n in by_name})
    _lane_axis(ax, ranks, [f"rank {r}" for r in ranks])
    ax.set_xlabel(tr("time ({unit})", unit=unit))
    if title:
        ax.set_title(title)
    return ax


def _inside(box, room):
    return (box.x0 >= room.x0 and box.x1 <= room.x1 and box.y0 >= room.y0
            and box.y1 <= room.y1)


def _overlap(a, b):
    """Strict: boxes that only touch do not overlap."""
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _visible_part(bar, later):
    """The widest stretch (x from, x to, data units) of ``bar`` that no bar in ``later``, drawn
    over it in its lane, covers: all-reduces of successive buckets overlap in time."""
    parts = [(bar.get_x(), bar.get_x() + bar.get_width())]
    for p in later:
        a, b = p.get_x(), p.get_x() + p.get_width()
        parts = [seg for lo, hi in parts for seg in ((lo, min(hi, a)), (max(lo, b), hi))
                 if seg[1] > seg[0]]
    return max(parts, key=lambda seg: seg[1] - seg[0], default=None)


def _room(ax, bar, part, pad):
    """The pixels of ``part`` of ``bar``, less ``pad`` on each side."""
    from matplotlib.transforms import Bbox
    box = Bbox([[part[0], bar.get_y()], [part[1], bar.get_y() + bar.get_height()]])
    box = box.transformed(ax.transData)   # y runs down the rank axis: sort the corners
    return Bbox.from_extents(box.xmin, box.ymin, box.xmax, box.ymax).padded(-pad)


@functools.cache
def _fit_labels_class():
    # built on first use: importing labutils.viz stays free of matplotlib's artist classes
    from matplotlib.artist import Artist

    class FitLabels(Artist):
        """Bar labels shown only where they fit: centred in the visible part of their bar
        (less ``pad`` pixels), inside the axes and clear of labels already shown in the same
        lane. Decided in ``draw``, because a bar's width in pixels is only known then."""
        zorder = 3   # above the bars, like ``ax.text``

        def __init__(self, pad=2.0):
            super().__init__()
            self.pad, self.items = pad, []
            self.set_in_layout(False)    # shown labels never leave their bars

        def get_children(self):
            return [text for text, _ in self.items]

        def draw(self, renderer):
            if not self.get_visible():
                return
            lanes, shown = {}, {}
            for p in self.axes.patches:
                lanes.setdefault(p.get_y(), []).append(p)
            where = {id(p): i for lane in lanes.values() for i, p in enumerate(lane)}
            for text, bar in self.items:
                text.set_visible(self._fits(text, bar, lanes, where, shown, renderer))
                if text.get_visible():
                    text.draw(renderer)
            self.stale = False

        def _fits(self, text, bar, lanes, where, shown, renderer):
            later = lanes[bar.get_y()][where[id(bar)] + 1:] if id(bar) in where else []
            part = _visible_part(bar, later)
            if part is None:
                return False
            text.set_x((part[0] + part[1]) / 2)
            text.set_visible(True)       # an invisible Text measures as an empty box
            box = text.get_window_extent(renderer)
            lane = shown.setdefault(bar.get_y(), [])
            if (_inside(box, _room(self.axes, bar, part, self.pad))
                    and _inside(box, self.axes.bbox)
                    and not any(_overlap(box, other) for other in lane)):
                lane.append(box)
                return True
            return False

    return FitLabels


def _label_bars(ax, labelled, fontsize=MIN_POINTS):
    """Centre each ``(bar, label)``'s label in its bar, drawn only when it fits (FitLabels)."""
    from matplotlib.colors import to_rgb
    from matplotlib.text import Text
    layer = _fit_labels_class()()
    ax.add_artist(layer)
    for bar, label in labelled:
        r, g, b = to_rgb(bar.get_facecolor())
        text = Text(bar.get_x() + bar.get_width() / 2, bar.get_y() + bar.get_height() / 2,
                    str(label), ha="center", va="center", fontsize=fontsize,
                    color="black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white")
        text.set_transform(ax.transData)
        text.set_figure(ax.figure)
        text.axes = ax
        layer.items.append((text, bar))
    return layer


def _legend_outside(ax, colors, fontsize=None):
    """Legend right of the axes, one entry a line: it never covers a bar."""
    if not colors:
        return None
    from matplotlib.patches import Patch
    handles = [Patch(facecolor=c, edgecolor="black", linewidth=0.3) for c in colors.values()]
    return ax.legend(handles, [label(n) for n in colors], loc="upper left", bbox_to_anchor=(1.01, 1),
                     borderaxespad=0, fontsize=fontsize, frameon=False)


def _lane_axis(ax, lanes, names):
    """Ticks at whole lanes only, first lane on top; every k-th lane when a label per lane
    would crowd the axes (many ranks in a short panel), never a tick between two lanes."""
    if not lanes:
        return
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties
    size = FontProperties(size=rcParams["ytick.labelsize"]).get_size_in_points()
    room = ax.bbox.height * 72 / ax.figure.dpi     # axes height in points, before layout
    step = max(1, math.ceil((max(lanes) - min(lanes) + 1) * 1.5 * size / max(room, 1.0)))
    ax.set_yticks(lanes[::step], names[::step])
    ax.set_ylim(max(lanes) + 0.5, min(lanes) - 0.5)   # inverted, and stays so if redrawn


def plot_overlap(spans, ax=None, title=""):
    """Gantt chart with two lanes per rank: compute (forward, backward, then the wait for the
    last buckets) and communication (``allreduce`` spans, or a bucket's ``peer wait`` and
    ``transfer`` from ``lu.comm_spans``; its ``queue`` spans overlap each other and are not
    drawn). Bucket labels show only where they fit in their bar and clear each other (buckets'
    spans can overlap in time); the legend sits right of the axes."""
    import matplotlib.pyplot as plt

    spans = normalise(spans)
    ranks = sorted({s.rank for s in spans})
    if ax is None:   # constrained layout keeps the outside legend inside the figure
        _, ax = plt.subplots(figsize=(WIDTH, 1.1 * len(ranks) + 1), layout="constrained")
    labelled = []
    for s in spans:
        if s.name == "queue":
            continue
        lane = s.rank * 2 + (1 if s.name in COMM_NAMES else 0)
        bar = ax.barh(lane, s.duration * 1e3, left=s.start * 1e3, height=0.8,
                      color=DEFAULT_COLORS.get(s.name, "grey"), edgecolor="black",
                      linewidth=0.3).patches[0]
        if s.label and s.name in ("allreduce", "transfer"):
            labelled.append((bar, s.label))
    _label_bars(ax, labelled)
    _lane_axis(ax, [2 * r + k for r in ranks for k in (0, 1)],
               [f"rank {r} {label(what)}" for r in ranks for what in ("compute", "comm")])
    names = [n for n in ("forward", "backward", "wait") + COMM_NAMES
             if any(s.name == n for s in spans)]
    _legend_outside(ax, {n: DEFAULT_COLORS[n] for n in names})
    ax.set_xlabel(tr("time ({unit})", unit="ms"))
    if title:
        ax.set_title(title)
    return ax
