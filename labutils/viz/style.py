"""Matplotlib settings the labs share: a Chinese font behind DejaVu Sans for the Chinese edition.

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
