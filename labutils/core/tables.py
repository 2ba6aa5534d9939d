"""Tables as text: aligned columns for a notebook's output, Markdown for files (the benchmark
results). Numbers print to 4 significant digits. Columns are padded by display width, not by
characters: a wide character (Chinese, full-width punctuation: East Asian width W or F) takes two
columns of a monospaced font, so a Chinese header lines up with the numbers under it."""
from __future__ import annotations

import unicodedata


def display_width(text):
    """Columns ``text`` takes in a monospaced font: 2 for each wide character (East Asian
    width W or F), 0 for a combining mark, 1 for every other character."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else
               0 if unicodedata.combining(ch) else 1 for ch in text)


def pad(text, width, right=False):
    """``text`` followed (``right``: preceded) by spaces up to ``width`` display columns
    (``str.ljust`` counts characters, which misaligns wide ones)."""
    fill = " " * max(0, width - display_width(text))
    return fill + text if right else text + fill


def _cells(rows):
    return [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in row] for row in rows]


def text_table(rows, header, align=None):
    """``rows`` under ``header`` as aligned text columns; ``align``, one letter per column
    ("l" or "r", e.g. "lrrr"), right-aligns the "r" columns (numbers), default all left."""
    cells = _cells(rows)
    header = [str(h) for h in header]
    align = align or "l" * len(header)
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"align needs one letter, l or r, per column ({len(header)}); "
                         f"got {align!r}")
    widths = [max([display_width(h)] + [display_width(r[i]) for r in cells])
              for i, h in enumerate(header)]

    def line(row):
        return "  ".join(pad(c, w, a == "r") for c, w, a in zip(row, widths, align)).rstrip()
    return "\n".join([line(header)] + [line(r) for r in cells])


def table(rows, header, align=None):
    """Print ``rows`` under ``header`` as aligned text columns (``align``: see text_table)."""
    print(text_table(rows, header, align))


def markdown_table(rows, header):
    """``rows`` under ``header`` as a Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in _cells(rows)]
    return "\n".join(lines)
