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


def pad(text, width):
    """``text`` followed by spaces up to ``width`` display columns (``str.ljust`` counts
    characters, which misaligns wide ones)."""
    return text + " " * max(0, width - display_width(text))


def _cells(rows):
    return [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in row] for row in rows]


def text_table(rows, header):
    """``rows`` under ``header`` as aligned text columns."""
    cells = _cells(rows)
    header = [str(h) for h in header]
    widths = [max([display_width(h)] + [display_width(r[i]) for r in cells])
              for i, h in enumerate(header)]
    lines = ["  ".join(pad(h, w) for h, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(pad(c, w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def table(rows, header):
    """Print ``rows`` under ``header`` as aligned text columns."""
    print(text_table(rows, header))


def markdown_table(rows, header):
    """``rows`` under ``header`` as a Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in _cells(rows)]
    return "\n".join(lines)
