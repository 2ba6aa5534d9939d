"""Issue 31: figures read on a 1,024 px projector. JupyterLab's output area is then 844 px wide
(file browser closed; tests/test_browser.py measures it): a wider figure is scaled down, its
text with it. So every figure the labs store, and every labutils figure, is at most that wide,
and no text is drawn below ``MIN_POINTS`` (viz/style.py)."""
from __future__ import annotations

import base64
import io
import json
import re
import struct
from pathlib import Path

import matplotlib
import pytest

from labutils.viz import style

from .test_i18n import _figures

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + \
    sorted((ROOT / "notebooks" / "zh").glob("*.ipynb"))


def _png_width(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">I", data[16:20])[0]


def _stored_figures():
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for i, cell in enumerate(cells):
            for out in cell.get("outputs", []):
                if "image/png" in out.get("data", {}):
                    yield path, i, base64.b64decode(out["data"]["image/png"])


def test_every_stored_figure_fits_the_output_area_at_1024_px():
    figures = list(_stored_figures())
    assert len(figures) > 60
    wide = [f"{p.relative_to(ROOT)} cell {i}: {_png_width(png)} px"
            for p, i, png in figures if _png_width(png) > style.OUTPUT_PX]
    assert wide == [], (f"wider than {style.OUTPUT_PX} px, scaled down on a projector: "
                        "keep figsize's width at most labutils.viz.style.WIDTH inches")


FONT_SIZE = re.compile(r"\b(fontsize|labelsize|size)=(\d+(\.\d+)?)\b")
FIG_SIZE = re.compile(r"figsize=\((\d+(\.\d+)?),")


def test_no_figure_code_sets_small_text_or_a_wide_figure():
    sources = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
               for p in (ROOT / "labutils" / "viz").glob("*.py")}
    for path in NOTEBOOKS:
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            if cell["cell_type"] == "code":
                sources[f"{path.relative_to(ROOT)} cell {i}"] = "".join(cell["source"])
    small = [f"{where}: {m.group(0)}" for where, text in sources.items()
             for m in FONT_SIZE.finditer(text) if float(m.group(2)) < style.MIN_POINTS]
    wide = [f"{where}: {m.group(0)}" for where, text in sources.items()
            for m in FIG_SIZE.finditer(text) if float(m.group(1)) > style.WIDTH]
    assert small == [] and wide == [], (small, wide)


def _mesh():
    from labutils.cost.parallel_dims import ParallelDims
    from labutils.viz.mesh_plot import plot_mesh
    return plot_mesh(ParallelDims(dp=2, tp=2, pp=2), rank=5)


@pytest.mark.parametrize("name", sorted(_figures()) + ["plot_mesh"])
def test_labutils_figures_fit_and_draw_no_small_text(name):
    import matplotlib.pyplot as plt
    with matplotlib.rc_context(style.PROJECTOR):
        drawn = _mesh() if name == "plot_mesh" else _figures()[name]()
        fig = drawn if hasattr(drawn, "savefig") else (
            drawn.figure if hasattr(drawn, "figure") else drawn[0].figure)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")  # as the inline backend does
        sizes = {t.get_text(): t.get_fontsize() for t in fig.findobj(matplotlib.text.Text)
                 if t.get_text() and t.get_visible()}
    plt.close(fig)
    assert _png_width(buf.getvalue()) <= style.OUTPUT_PX
    assert sizes and min(sizes.values()) >= style.MIN_POINTS, sizes


def test_the_projector_sizes():
    """Ticks and legends of 10 pt are 14 px at 100 dpi; the figure fits at its own size."""
    assert style.WIDTH * style.PROJECTOR["figure.dpi"] <= style.OUTPUT_PX
    assert min(v for k, v in style.PROJECTOR.items()
               if k.endswith("size") and k != "figure.figsize") >= 10
    assert style.fit_width(13.2, 6.6) == pytest.approx((style.WIDTH, style.WIDTH / 2))
    assert style.fit_width(6, 3) == (6, 3)
