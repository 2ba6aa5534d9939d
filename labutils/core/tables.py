"""Tables as text: aligned columns for a notebook's output, Markdown for files (the benchmark
results). Numbers print to 4 significant digits."""
from __future__ import annotations


def _cells(rows):
    return [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in row] for row in rows]


def text_table(rows, header):
    """``rows`` under ``header`` as aligned text columns."""
    cells = _cells(rows)
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def table(rows, header):
    """Print ``rows`` under ``header`` as aligned text columns."""
    print(text_table(rows, header))


def markdown_table(rows, header):
    """``rows`` under ``header`` as a Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in _cells(rows)]
    return "\n".join(lines)
