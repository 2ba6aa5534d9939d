"""Is every figure the teacher's guide quotes from "the committed run" still what that run printed?

The guide (guide/<lab>.md, guide/zh/<lab>.md) tells a teacher what to expect by quoting the
committed notebook's stored outputs: "the committed run printed 1.22x (95% CI 1.07-1.47)". After a
lab is executed again those figures change, and a guide that quotes the old run contradicts the
notebook the teacher projects. This check reads each block (a paragraph, or a list with the line
above it, between blank lines) that names the committed run ("committed run", "committed
table", 「提交的运行」, 「提交的那次运行」) and looks up every decimal number in it (sign aside)
among the lab's stored outputs (English page: notebooks/<lab>.ipynb; Chinese page: notebooks/zh/,
whose run is its own). A number that is in the lab's code or markdown is a parameter, not a
result, and passes; a number that is neither (a prediction, the course map's budget) is named in
an HTML comment on the page, ``<!-- not from the run: 1.5 0.23 -->``, which the site does not
show.

    python tools/guide_quotes.py            # list stale quotes; exit 1 if any
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKERS = {"en": re.compile(r"committed (run|table)"), "zh": re.compile(r"提交的(那次)?运行")}
# a decimal, in e-notation too, or a ratio's "1.75x"; signs aside (− or -)
NUMBER = re.compile(r"(?<![\w.])\d+\.\d+(?:e[-+]?\d+)?(?=x\b|(?![\w.]))")


def numbers(text: str) -> list[str]:
    """The decimals of ``text``, e-notation written one way: 1.4e-04 and 1.4e-4 are one number."""
    return [re.sub(r"e([-+]?)0*(\d)", r"e\1\2", n) for n in NUMBER.findall(text)]
NOT_FROM_RUN = re.compile(r"<!--\s*not from the run:([^>]*)-->")


def notebook_texts(path: Path) -> tuple[str, str]:
    """(the stored outputs' text, the cells' sources) of a notebook."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    outputs, sources = [], []
    for cell in nb["cells"]:
        sources.append("".join(cell["source"]))
        for output in cell.get("outputs", []):
            outputs.append("".join(output.get("text", "")))
            data = output.get("data", {})
            outputs += ["".join(data[m]) for m in ("text/plain", "text/markdown", "text/html")
                        if m in data]
    return "\n".join(outputs), "\n".join(sources)


def stale_quotes(page: Path, notebook: Path, lang: str) -> list[str]:
    """The decimal numbers that ``page``'s committed-run paragraphs quote and ``notebook`` did
    not print."""
    text = page.read_text(encoding="utf-8")
    outputs, sources = notebook_texts(notebook)
    allowed = {n for group in NOT_FROM_RUN.findall(text) for n in numbers(group)}
    stale = []
    printed = set(numbers(outputs)) | set(numbers(sources))
    # a block (blank lines around it: a paragraph, or a list under a bold line that names the
    # run) that names the committed run: its numbers are the run's
    for block in re.split(r"\n\s*\n", text):
        if MARKERS[lang].search(block):
            stale += [n for n in numbers(block) if n not in printed | allowed]
    return stale


def pages():
    """(lang, guide page, the notebook it quotes) for every guide page."""
    for lang, folder, notebooks in (("en", ROOT / "guide", ROOT / "notebooks"),
                                    ("zh", ROOT / "guide" / "zh", ROOT / "notebooks" / "zh")):
        for page in sorted(folder.glob("*.md")):
            yield lang, page, notebooks / f"{page.stem}.ipynb"


def main() -> int:
    problems = 0
    for lang, page, notebook in pages():
        stale = stale_quotes(page, notebook, lang)
        if stale:
            problems += len(stale)
            print(f"{page.relative_to(ROOT)}: quotes {', '.join(stale)}, which "
                  f"{notebook.relative_to(ROOT)} does not print; fix: quote its stored "
                  f"outputs (or name a number that is no result in "
                  f"<!-- not from the run: ... -->)")
    print(f"{problems} stale quote(s) in the teacher's guide")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
