"""Matplotlib settings the labs share: figures sized for a projector, and a Chinese font behind
DejaVu Sans for the Chinese edition.

A classroom projector shows 1,024 px. JupyterLab's output area is then 844 px wide with the file
browser closed (Ctrl+B; measured in Chromium by tests/test_browser.py) and 592 px with it open.
A figure at most ``WIDTH`` inches wide at 100 dpi is shown at its own size, so its text keeps the
point sizes of ``PROJECTOR``: ticks and legends of 10 pt are 14 px on the screen. A wider figure
is scaled down to the output area, and its text with it (a 1,331 px figure's 8-pt legend
showed at 5 pt). Every stored figure is checked against ``OUTPUT_PX`` (tests/test_projector.py).

DejaVu Sans, matplotlib's default, has no Chinese glyphs. Matplotlib (3.6 and later) falls back
glyph by glyph along ``font.family`` when it lists several families, so the Chinese edition's
figures list DejaVu Sans first (Latin text and digits as in the English edition) and then the
first installed Chinese font. Only installed families are named: a missing one costs a warning
per figure. A font installed after matplotlib built its font cache (`make test` installs
WenQuanYi Micro Hei on a fresh machine) is not in the cache: it is looked for by file name in the
system's font folders and registered (no subprocess: fontconfig's fc-list would be one).
"""
from __future__ import annotations

import os
from pathlib import Path

OUTPUT_PX = 844   # JupyterLab's output area at 1,024 px, file browser closed
WIDTH = 8.2       # inches: 820 px at 100 dpi, room for the tight bounding box's margin
MIN_POINTS = 9    # the smallest text a figure draws (labels inside bars); the rest is larger
PROJECTOR = {"figure.dpi": 100, "savefig.dpi": "figure", "figure.figsize": (7.0, 3.4),
             "font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11,
             "xtick.labelsize": 10, "ytick.labelsize": 10, "legend.fontsize": 10,
             "legend.title_fontsize": 10, "figure.titlesize": 12}


def use_projector_style():
    """Sizes that read on a projector (``PROJECTOR``); figures the labs make stay within
    ``WIDTH`` inches. Called when labutils is imported in a notebook's kernel."""
    from matplotlib import rcParams
    rcParams.update(PROJECTOR)


def fit_width(width, height):
    """``(width, height)`` scaled down, aspect kept, to at most ``WIDTH`` inches wide: for
    figures whose natural size grows with what they draw (a mesh, a grid of collectives)."""
    scale = min(1.0, WIDTH / width)
    return width * scale, height * scale


# Linux (WenQuanYi: `make doctor` suggests it; Noto / Source Han), macOS, Windows
CHINESE_FONTS = ("WenQuanYi Micro Hei", "Noto Sans CJK SC", "Source Han Sans SC",
                 "WenQuanYi Zen Hei", "PingFang SC", "Hiragino Sans GB", "Heiti SC",
                 "Microsoft YaHei", "SimHei")


# the files of those fonts, as the packages install them
CHINESE_FONT_FILES = ("wqy-microhei.ttc", "wqy-zenhei.ttc", "NotoSansCJK-Regular.ttc",
                      "NotoSansCJKsc-Regular.otf", "SourceHanSansSC-Regular.otf",
                      "PingFang.ttc", "Hiragino Sans GB.ttc", "msyh.ttc", "simhei.ttf")


def _chinese_font_files():
    """Files of known Chinese fonts in the system's and the user's font folders."""
    from matplotlib import font_manager
    folders = [*font_manager.X11FontDirectories, *font_manager.OSXFontDirectories,
               os.path.join(os.environ.get("WINDIR", "C:/Windows"), "Fonts"),
               str(Path.home() / ".fonts"),
               str(Path.home() / ".local" / "share" / "fonts")]
    wanted, found = {name.lower() for name in CHINESE_FONT_FILES}, []
    for folder in dict.fromkeys(folders):
        for root, _, files in os.walk(folder):
            found += [os.path.join(root, f) for f in files if f.lower() in wanted]
    return sorted(found)


def chinese_font():
    """The family name of an installed Chinese font matplotlib can draw with, or None."""
    from matplotlib import font_manager
    manager = font_manager.fontManager
    known = {f.name for f in manager.ttflist}
    for family in CHINESE_FONTS:
        if family in known:
            return family
    for path in _chinese_font_files():   # installed after matplotlib's cache was built
        try:
            manager.addfont(path)
            return font_manager.FontProperties(fname=path).get_name()
        except (OSError, RuntimeError, ValueError):
            continue
    return None


def use_chinese_font():
    """Draw Chinese text in figures: DejaVu Sans, then a Chinese font. Returns the Chinese
    font's family, or None when there is none (then Chinese glyphs draw as boxes; `make
    doctor` says what to install)."""
    from matplotlib import rcParams
    family = chinese_font()
    if family is not None:
        rcParams["font.family"] = ["DejaVu Sans", family]
    return family
