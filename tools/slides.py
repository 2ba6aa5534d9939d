"""Slideshow metadata for the labs, so a teacher presents one as live slides (JupyterLab's RISE
extension, ``jupyterlab-rise`` in requirements.txt: the notebook toolbar's "Render as slideshow"
button, or the command ``RISE:slideshow``).

    python tools/slides.py apply [notebooks/NN_name.ipynb ...]   # set it (default: every lab)
    python tools/slides.py check [notebooks/NN_name.ipynb ...]   # exit 1 where it is not as set

Each cell's ``metadata.slideshow.slide_type`` follows from the cells alone (deterministic and
idempotent; what a cell had before does not count):
- "slide": the first cell (the title, central question and lesson plan) and each section
  heading (a markdown cell that starts with ``## ``);
- "subslide" (a step down, within the section): a ``### `` heading, and any cell that would
  not fit on the current slide with the cells before it (about 26 lines at a projector's
  1,024 x 768: source lines, wrapped markdown, printed output capped at 24 lines, a figure
  counted as 16), so a long listing or a long output gets a slide of its own;
- "fragment": a short markdown cell right after a code cell (what the result means), shown
  after the result on the same slide;
- "-": everything else, on the slide before it.
The notebook's ``metadata.rise`` lets a tall slide scroll. The Chinese notebooks take the
English cells' metadata when tools/zh_catalog.py builds them.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET = 26          # lines that fit on one slide
OUTPUT_CAP = 24      # a longer printed output scrolls inside its slide
FIGURE = 16          # lines a figure takes
MARKDOWN_WIDTH = 100  # characters per projected markdown line
RISE = {"scroll": True}


def _source(cell) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def height(cell) -> int:
    """About how many lines the cell takes on a slide."""
    src = _source(cell)
    if cell["cell_type"] == "markdown":
        return sum(max(1, -(-len(line) // MARKDOWN_WIDTH)) for line in src.splitlines())
    lines, out = len(src.splitlines()), 0
    for o in cell.get("outputs", []):
        data = o.get("data", {})
        if "image/png" in data or "image/svg+xml" in data:
            out += FIGURE
        elif o.get("output_type") == "stream":
            out += len(_source({"source": o.get("text", "")}).splitlines())
        elif "text/plain" in data or "text/html" in data:
            out += len(_source({"source": data.get("text/plain", "")}).splitlines())
    return lines + min(out, OUTPUT_CAP)


def slide_types(cells: list[dict]) -> list[str]:
    types, used, previous = [], 0, None
    for i, cell in enumerate(cells):
        src, h = _source(cell).lstrip(), height(cell)
        markdown = cell["cell_type"] == "markdown"
        if i == 0 or (markdown and src.startswith("## ")):
            kind, used = "slide", h
        elif markdown and src.startswith("### "):
            kind, used = "subslide", h
        elif used + h > BUDGET:
            kind, used = "subslide", h
        elif markdown and previous == "code" and h <= 8:
            kind, used = "fragment", used + h
        else:
            kind, used = "-", used + h
        types.append(kind)
        previous = cell["cell_type"]
    return types


def apply_to(nb: dict) -> dict:
    """``nb`` with its slideshow metadata set (changed in place)."""
    for cell, kind in zip(nb["cells"], slide_types(nb["cells"])):
        cell.setdefault("metadata", {})["slideshow"] = {"slide_type": kind}
    nb.setdefault("metadata", {})["rise"] = dict(RISE)
    return nb


def problems(nb: dict) -> list[str]:
    want = slide_types(nb["cells"])
    found = [f"cell {c.get('id')}: slide_type "
             f"{c.get('metadata', {}).get('slideshow', {}).get('slide_type')!r}, want {k!r}"
             for c, k in zip(nb["cells"], want)
             if c.get("metadata", {}).get("slideshow", {}).get("slide_type") != k]
    if nb.get("metadata", {}).get("rise") != RISE:
        found.append(f"metadata.rise is not {RISE}")
    return found


def _write(path: Path, nb: dict) -> None:
    """As nbformat writes a notebook (indent 1, non-ASCII kept), so only the metadata changes."""
    text = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    if path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def main(argv: list[str]) -> int | str:
    command, names = (argv[0], argv[1:]) if argv else ("", [])
    paths = [Path(n) for n in names] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    if command not in ("apply", "check") or any(not p.exists() for p in paths):
        return __doc__
    bad = 0
    for path in paths:
        nb = json.loads(path.read_text(encoding="utf-8"))
        if command == "apply":
            _write(path, apply_to(nb))
            kinds = slide_types(nb["cells"])
            print(f"{path}: {kinds.count('slide')} slides, {kinds.count('subslide')} subslides, "
                  f"{kinds.count('fragment')} fragments")
        else:
            found = problems(nb)
            bad += bool(found)
            print("\n".join(f"{path}: {line}" for line in found) or f"{path}: as set")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
