"""How tools/zh_catalog.py builds a Chinese notebook from its English one and its catalog.

Each English cell gets its entry's Chinese; a fuzzy entry its old Chinese, an untranslated one
the English, each under a visible 「译文待更新」 notice (a markdown line on top; in code a comment,
after a cell magic, and always with the English code: a fuzzy code cell keeps the old Chinese
comments and strings only where they still apply). Links that leave notebooks/ are rewritten for
notebooks/zh/. The stored outputs of the notebook it replaces are kept where the code is
unchanged (comments aside), so a translator's fix re-executes nothing.
"""
from __future__ import annotations

import copy
import re
from urllib.parse import urlsplit

import codewrap
import polib
from zh_code import carry_code, code_difference, code_key, source

LANGUAGE_CELL_ID = "zh-language"
# The cell that makes labutils print Chinese (checkers, panels, timing verdicts).
LANGUAGE_CELL = ("# 中文版：让 labutils 输出的文字（检查器、控制面板、计时结论）使用中文\n"
                 "import labutils as lu\n"
                 "lu.set_language(\"zh\")")
NOTICE = {  # (cell type, fuzzy?) -> the line a reader sees above a cell that needs a translator
    ("markdown", True): "> **「译文待更新」** 英文原文已修改，下面仍是旧译文。\n\n",
    ("markdown", False): "> **「译文待更新」** 本单元尚未翻译，下面是英文原文。\n\n",
    ("code", True): "# 「译文待更新」英文原文已修改，注释和字符串仍是旧译文\n",
    ("code", False): "# 「译文待更新」本单元尚未翻译，注释和字符串是英文原文\n",
}
_MD_LINK = re.compile(r"(\]\(\s*<?)([^)\s>]+)")
_HTML_LINK = re.compile(r"""(\b(?:href|src)\s*=\s*["'])([^"']+)""")


def is_fuzzy(entry) -> bool:
    return "fuzzy" in entry.flags and bool(entry.msgstr)


def _rewrite_target(url: str, lab_names: set[str]) -> str:
    """A link target written for notebooks/, as it must stand in notebooks/zh/."""
    parts = urlsplit(url)
    if not url or parts.scheme or parts.netloc or url.startswith(("#", "/")):
        return url  # external, an anchor on the same page, or absolute
    if "/" not in parts.path and parts.path.endswith(".ipynb") and parts.path[:-6] in lab_names:
        return url  # another lab: notebooks/zh/ has it under the same name
    return "../" + url


def rewrite_links(text: str, lab_names: set[str]) -> str:
    text = _MD_LINK.sub(lambda m: m.group(1) + _rewrite_target(m.group(2), lab_names), text)
    return _HTML_LINK.sub(lambda m: m.group(1) + _rewrite_target(m.group(2), lab_names), text)


def _with_notice(text: str, kind: str, fuzzy: bool) -> str:
    notice = NOTICE[kind, fuzzy]
    if kind == "markdown":
        return notice + text
    lines = text.splitlines(keepends=True)
    top = 0
    while top < len(lines) and lines[top].lstrip().startswith("%%"):
        top += 1  # a cell magic must stay the first line
    return "".join(lines[:top]) + notice + "".join(lines[top:])


def cell_text(cell: dict, entry) -> str:
    """What the Chinese notebook shows for an English cell and its entry (None: no entry)."""
    kind, src = cell["cell_type"], source(cell)
    if entry is None:
        return src
    if entry.translated():
        return entry.msgstr
    if not entry.msgstr:
        return _with_notice(src, kind, fuzzy=False)
    if kind == "markdown":
        return _with_notice(entry.msgstr, kind, fuzzy=True)
    # Fuzzy code: the English code always runs; the old Chinese where it still applies.
    if code_difference(src, entry.msgstr) is None:
        text = entry.msgstr
    else:
        text = (entry.previous_msgid is not None
                and carry_code(entry.previous_msgid, entry.msgstr, src, partial=True)) or src
    return _with_notice(codewrap.wrap(text)[0], kind, fuzzy=True)  # 90 characters a line


def notebook(en_nb: dict, po: polib.POFile, lab_names: set[str], old: dict | None = None) -> dict:
    """The Chinese notebook: the English cells, ids and metadata, text from the catalog
    (in step with ``en_nb``), the language cell before the first code cell, ``old``'s
    outputs where its code is unchanged (``keep_outputs``)."""
    entries = {e.msgctxt: e for e in po if not e.obsolete}
    cells = []
    for cell in en_nb["cells"]:
        cell = copy.deepcopy(cell)
        text = cell_text(cell, entries.get(cell["id"]))
        cell["source"] = rewrite_links(text, lab_names) if cell["cell_type"] == "markdown" else text
        if cell["cell_type"] == "code":
            if not any(c["cell_type"] == "code" for c in cells):
                cells.append({"cell_type": "code", "execution_count": None,
                              "id": LANGUAGE_CELL_ID, "metadata": {}, "outputs": [],
                              "source": LANGUAGE_CELL})
            cell["outputs"], cell["execution_count"] = [], None
            cell["metadata"].pop("execution", None)  # timestamps of the English run
        cells.append(cell)
    metadata = {k: v for k, v in en_nb["metadata"].items() if k != "widgets"}  # widget state
    nb = {"cells": cells, "metadata": metadata, "nbformat": en_nb["nbformat"],
          "nbformat_minor": en_nb["nbformat_minor"]}
    if old is not None:
        keep_outputs(nb, old)
    return nb




def keep_outputs(built: dict, old: dict) -> None:
    """Give each built code cell the outputs of ``old``'s cell of the same id and code (comments
    aside: a translator's fix keeps what the lab printed). When any code cell changed, was added
    or removed, the kept cells lose their execution counts: the lab needs executing again."""
    def code(nb):
        return [(c.get("id"), code_key(source(c))) for c in nb["cells"] if c["cell_type"] == "code"]
    same = code(built) == code(old)
    before = {c.get("id"): c for c in old["cells"] if c["cell_type"] == "code"}
    for cell in built["cells"]:
        was = before.get(cell["id"]) if cell["cell_type"] == "code" else None
        if was is None or code_key(source(was)) != code_key(source(cell)):
            continue
        cell["outputs"] = was.get("outputs", [])
        cell["execution_count"] = was.get("execution_count") if same else None
        if "execution" in was.get("metadata", {}):
            cell["metadata"]["execution"] = was["metadata"]["execution"]
    if same:  # what the run recorded: the kernel's language_info, the widgets' state
        for key in ("language_info", "widgets"):
            if key in old.get("metadata", {}):
                built["metadata"][key] = old["metadata"][key]


def needs_execution(nb: dict) -> bool:
    return any(c["cell_type"] == "code" and c.get("execution_count") is None for c in nb["cells"])


def notebook_text(nb: dict) -> str:
    """As nbformat (and so nbconvert and JupyterLab) writes a notebook."""
    import nbformat
    return nbformat.writes(nbformat.from_dict(nb)) + "\n"


def stale_cells(built: dict, committed: dict) -> list[str]:
    """Where a committed Chinese notebook's cells differ from what ``build`` makes now (a hand
    edit, or a build older than its catalog or English notebook): one line per cell."""
    want = [(c["id"], c["cell_type"], source(c)) for c in built["cells"]]
    have = [(c.get("id"), c["cell_type"], source(c)) for c in committed["cells"]]
    if [w[0] for w in want] != [h[0] for h in have]:
        return [f"the cells differ in number or order ({len(have)} committed, {len(want)} built)"]
    return [f"cell {w[0]} ({w[1]}) differs from its build" for w, h in zip(want, have) if w != h]


