"""The Chinese edition's lab catalogs: one gettext catalog per lab, ``translations/zh/<lab>.po``.

One entry per cell: ``msgctxt`` is the cell id, ``msgid`` the English cell source, ``msgstr`` the
Chinese, ``#.`` the cell type; read and written with polib, so Poedit or Weblate can edit them.
Every markdown cell has an entry, and every code cell with a comment (other than nbval markers)
or a sentence in a string; other code cells are copied. Translated code may differ from the
English only in comments and string literals (token for token, tools/zh_code.py), so the Chinese
edition runs the English code. Links keep the English targets; ``build`` rewrites those that
leave notebooks/ for notebooks/zh/.

    python tools/zh_catalog.py update [LAB ...]    # sync the catalogs with the English (msgmerge)
    python tools/zh_catalog.py check [LAB ...]     # errors exit 1; fuzzy/untranslated only warn
    python tools/zh_catalog.py check --release     # also exit 1 on any fuzzy or untranslated cell
    python tools/zh_catalog.py build [LAB ...]     # update, then write notebooks/zh/<lab>.ipynb
    python tools/zh_catalog.py execute [LAB ...]   # build, then execute what needs it (make zh)
    python tools/zh_catalog.py skeleton LAB        # a new lab's catalog, every cell untranslated
    python tools/zh_catalog.py migrate             # translations/zh/*.md -> *.po (tools/zh_migrate.py)

``update`` works as msgmerge does: a changed English cell becomes fuzzy with the English its
Chinese translated kept as ``#| msgid`` (``check`` prints the English diff); a new cell is
untranslated; a vanished cell's entry becomes obsolete (``#~``). A code cell whose comments and
strings are unchanged and in the same order takes its Chinese over (no fuzzy): a reformat needs
no translator. ``build`` gives a fuzzy cell its old Chinese and an untranslated cell the English,
each under a visible 「译文待更新」 notice (a markdown line on top, a comment in code), so the
English labs change without blocking CI; ``make release`` refuses until none is left.

The built notebook has the English cells, ids and metadata, with one code cell added before the
first code cell (id ``zh-language``: ``lu.set_language("zh")``). It keeps the stored outputs of the
notebook it replaces for every code cell whose code (comments aside) is unchanged; where any
code changed, the lab needs executing again (its changed cells lose their outputs, all cells
their execution counts), which ``execute`` does and ``check`` reports.
"""
from __future__ import annotations

import copy
import difflib
import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import polib

# Run as a script or loaded from its path by the tests: either way its sibling modules import.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from zh_code import (carry_code, code_difference, code_key, needs_entry,  # noqa: E402
                     source)

ROOT = Path(__file__).resolve().parent.parent
EN_DIR = ROOT / "notebooks"
CATALOG_DIR = ROOT / "translations" / "zh"
ZH_DIR = EN_DIR / "zh"
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


def labs() -> list[str]:
    """Every English lab (notebooks/*.ipynb), in file-name order."""
    return sorted(path.stem for path in EN_DIR.glob("*.ipynb"))


def read_notebook(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def catalog_path(lab: str) -> Path:
    return CATALOG_DIR / f"{lab}.po"


def new_catalog(lab: str) -> polib.POFile:
    po = polib.POFile(wrapwidth=0)  # one line per cell line: readable diffs, no re-wrapping
    po.header = (f"Simplified Chinese translation of notebooks/{lab}.ipynb: one entry per cell "
                 f"(msgctxt: its id).\nSee tools/zh_catalog.py and translations/zh/TERMS.md.")
    po.metadata = {"Project-Id-Version": lab, "Language": "zh_CN", "MIME-Version": "1.0",
                   "Content-Type": "text/plain; charset=UTF-8",
                   "Content-Transfer-Encoding": "8bit"}
    return po


def read_catalog(lab: str) -> polib.POFile:
    po = polib.pofile(str(catalog_path(lab)), wrapwidth=0)
    return po


def write_catalog(lab: str, po: polib.POFile) -> bool:
    """Save if the text changed; True when it did."""
    path, text = catalog_path(lab), str(po) + "\n"
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return True


def is_fuzzy(entry) -> bool:
    return "fuzzy" in entry.flags and bool(entry.msgstr)


def _unfuzzy(entry) -> None:
    if "fuzzy" in entry.flags:
        entry.flags.remove("fuzzy")
    entry.previous_msgid = None


# -- update: msgmerge for notebooks --------------------------------------------------------------
def merge(po: polib.POFile, en_nb: dict) -> polib.POFile:
    """``po`` synced with the English notebook, in its cell order (changed in place)."""
    by_id = {e.msgctxt: e for e in po}
    ids = []
    for cell in en_nb["cells"]:
        cid, kind, src = cell.get("id"), cell["cell_type"], source(cell)
        ids.append(cid)
        entry = by_id.get(cid)
        if entry is None:
            if cid and needs_entry(cell):
                by_id[cid] = polib.POEntry(msgctxt=cid, msgid=src, msgstr="", comment=kind)
            continue
        entry.obsolete, entry.comment = False, kind
        if entry.msgid == src:
            continue
        # The English the Chinese translated: the previous msgid of a fuzzy entry (None when a
        # migration could not find it), else the msgid.
        base = entry.previous_msgid if is_fuzzy(entry) else entry.msgid
        carried = None
        if entry.msgstr and base is not None:
            carried = (carry_code(base, entry.msgstr, src) if kind == "code"
                       else entry.msgstr if base == src else None)  # markdown changed back
        if carried is not None:
            entry.msgstr = carried
            _unfuzzy(entry)
        elif entry.msgstr and not is_fuzzy(entry):
            entry.flags.append("fuzzy")
            entry.previous_msgid = entry.msgid
        entry.msgid = src
    for cid, entry in by_id.items():
        if cid not in ids:
            entry.obsolete = True
    order = {cid: i for i, cid in enumerate(ids)}
    po[:] = sorted(by_id.values(), key=lambda e: (e.obsolete, order.get(e.msgctxt, len(ids))))
    return po


def skeleton(lab: str) -> polib.POFile:
    """A catalog with every cell that needs an entry untranslated."""
    return merge(new_catalog(lab), read_notebook(EN_DIR / f"{lab}.ipynb"))


def update(lab: str) -> bool:
    """Sync translations/zh/<lab>.po with its English notebook; True when the file changed."""
    return write_catalog(lab, merge(read_catalog(lab), read_notebook(EN_DIR / f"{lab}.ipynb")))


# -- checking ------------------------------------------------------------------------------------
def catalog_problems(lab: str, en_nb: dict, po: polib.POFile) -> list[str]:
    """The errors of one lab's catalog (fuzzy and untranslated cells are not errors), one line
    each, naming the cell and the fix."""
    where = f"translations/zh/{lab}.po"
    problems, ids = [], set()
    for cell in en_nb["cells"]:
        if not cell.get("id"):
            problems.append(f"{lab}: a {cell['cell_type']} cell has no id; fix: save the English "
                            f"notebook with nbformat 4.5 or later (cells get ids)")
        ids.add(cell.get("id"))
    if LANGUAGE_CELL_ID in ids:
        problems.append(f"{lab}: an English cell has the id {LANGUAGE_CELL_ID}, which the Chinese "
                        f"edition's language cell uses; fix: give it another id")
    seen = set()
    for entry in po:
        if entry.msgctxt in seen:
            problems.append(f"{lab}: cell {entry.msgctxt} has two entries in {where}; fix: keep one")
        seen.add(entry.msgctxt)
        if (entry.comment == "code" and not entry.obsolete and entry.translated()):
            diff = code_difference(entry.msgid, entry.msgstr)
            if diff:
                problems.append(f"{lab}: cell {entry.msgctxt} (code): {diff}; fix: in {where}, "
                                f"change only comments and string literals")
    if str(merge(copy.deepcopy(po), en_nb)) != str(po):
        problems.append(f"{lab}: {where} is not in step with notebooks/{lab}.ipynb; fix: make zh "
                        f"(or python tools/zh_catalog.py update {lab})")
    return problems


def pending(lab: str, po: polib.POFile) -> list[str]:
    """A line per fuzzy cell with its English diff, and per untranslated cell."""
    lines = []
    for e in po:
        if e.obsolete:
            continue
        if is_fuzzy(e):
            lines.append(f"{lab}: cell {e.msgctxt} ({e.comment}) is fuzzy: the English changed "
                         f"since it was translated; its English diff:")
            if e.previous_msgid is None:
                lines.append("    (the English it translated is not known; compare with msgid)")
            else:
                diff = difflib.unified_diff(e.previous_msgid.splitlines(), e.msgid.splitlines(),
                                            "translated", "now", n=1, lineterm="")
                lines += ["    " + d for d in list(diff)[2:]]
        elif not e.msgstr:
            lines.append(f"{lab}: cell {e.msgctxt} ({e.comment}) has no translation yet")
    return lines


def check(names: list[str] | None = None) -> tuple[list[str], list[str]]:
    """(errors, pending lines) of every lab: catalogs and committed Chinese notebooks."""
    problems, waiting, all_labs = [], [], labs()
    for lab in names or all_labs:
        if not catalog_path(lab).exists():
            problems.append(f"{lab}: no catalog; fix: python tools/zh_catalog.py skeleton {lab}, "
                            f"then translate translations/zh/{lab}.po")
            continue
        try:
            en_nb, po = read_notebook(EN_DIR / f"{lab}.ipynb"), read_catalog(lab)
        except (OSError, ValueError) as exc:
            problems.append(f"{lab}: translations/zh/{lab}.po: {exc}")
            continue
        found = catalog_problems(lab, en_nb, po)
        problems += found
        waiting += pending(lab, merge(copy.deepcopy(po), en_nb))
        zh_path = ZH_DIR / f"{lab}.ipynb"
        if found:
            continue
        if not zh_path.exists():
            problems.append(f"{lab}: no notebooks/zh/{lab}.ipynb; fix: make zh")
            continue
        committed = read_notebook(zh_path)
        built = build_notebook(lab, en_nb, po, set(all_labs), verify=False)
        problems += [f"{lab}: notebooks/zh/{lab}.ipynb: {line}; fix: edit translations/zh/"
                     f"{lab}.po, not the notebook, then make zh"
                     for line in stale_cells(built, committed)]
        if needs_execution(committed):
            problems.append(f"{lab}: notebooks/zh/{lab}.ipynb has code cells not executed since "
                            f"their code changed; fix: make zh")
    return problems, waiting


# -- building ------------------------------------------------------------------------------------
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


class CatalogError(Exception):
    """A catalog that cannot be built; ``problems`` lists every problem found."""

    def __init__(self, problems):
        super().__init__("\n".join(problems))
        self.problems = problems


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
    return _with_notice(text, kind, fuzzy=True)


def build_notebook(lab: str, en_nb: dict, po: polib.POFile, lab_names: set[str] | None = None,
                   old: dict | None = None, verify: bool = True) -> dict:
    """The Chinese notebook of ``lab`` from a catalog in step with ``en_nb``, with ``old``'s
    outputs where its code is unchanged (see ``keep_outputs``). Raises CatalogError unless
    ``verify`` is false (the caller has checked)."""
    problems = catalog_problems(lab, en_nb, po) if verify else []
    if problems:
        raise CatalogError(problems)
    lab_names = set(labs()) if lab_names is None else lab_names
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


def build(lab: str) -> tuple[Path, bool]:
    """Update the catalog, then write notebooks/zh/<lab>.ipynb with the stored outputs kept
    where the code is unchanged; returns its path and whether it needs executing."""
    update(lab)
    path, old = ZH_DIR / f"{lab}.ipynb", None
    if path.exists():
        old = read_notebook(path)
    nb = build_notebook(lab, read_notebook(EN_DIR / f"{lab}.ipynb"), read_catalog(lab), old=old)
    text = notebook_text(nb)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        ZH_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return path, needs_execution(nb)


def stale_cells(built: dict, committed: dict) -> list[str]:
    """Where a committed Chinese notebook's cells differ from what ``build`` makes now (a hand
    edit, or a build older than its catalog or English notebook): one line per cell."""
    want = [(c["id"], c["cell_type"], source(c)) for c in built["cells"]]
    have = [(c.get("id"), c["cell_type"], source(c)) for c in committed["cells"]]
    if [w[0] for w in want] != [h[0] for h in have]:
        return [f"the cells differ in number or order ({len(have)} committed, {len(want)} built)"]
    return [f"cell {w[0]} ({w[1]}) differs from its build" for w, h in zip(want, have) if w != h]


def execute(path: Path) -> None:
    """Execute a built notebook in place as the English labs are (nbconvert). The labs find
    their data through labutils, so the working folder may be notebooks/zh/, which the
    relative links of the Chinese notebook are written for."""
    subprocess.run([sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute",
                    "--inplace", "--ExecutePreprocessor.timeout=600", path.name],
                   cwd=path.parent, check=True)


# -- the command line ----------------------------------------------------------------------------
def _report(problems: list[str], waiting: list[str], release: bool, n_labs: int) -> int:
    for line in problems + waiting:
        print(line)
    cells = sum(1 for line in waiting if not line.startswith(" "))
    if cells:
        print(f"warning: {cells} fuzzy or untranslated cell(s): the Chinese edition shows "
              f"「译文待更新」 there; translate them in translations/zh/*.po (make release "
              f"refuses until none is left)", file=sys.stderr)
    print(f"{len(problems)} problem(s) in {n_labs} lab(s)",
          file=sys.stderr if problems else sys.stdout)
    return 1 if problems or (release and cells) else 0


def main(argv: list[str]) -> int | str:
    release = "--release" in argv
    argv = [a for a in argv if a != "--release"]
    command, names = (argv[0], argv[1:]) if argv else ("", [])
    unknown = [n for n in names if not (EN_DIR / f"{n}.ipynb").exists()]
    if unknown or command not in ("update", "check", "build", "execute", "skeleton", "migrate"):
        return (f"no such lab: {', '.join(unknown)}\n" if unknown else "") + __doc__
    if command == "migrate":
        import zh_migrate
        return zh_migrate.main(names)
    if command == "skeleton":
        if len(names) != 1 or catalog_path(names[0]).exists():
            return "skeleton takes one lab without a catalog (an existing one is not overwritten)"
        write_catalog(names[0], skeleton(names[0]))
        print(catalog_path(names[0]))
        return 0
    if command == "check":
        return _report(*check(names), release, len(names or labs()))
    failed, to_run = [], []
    for lab in names or labs():
        try:
            if command == "update":
                print(f"update: translations/zh/{lab}.po {'changed' if update(lab) else 'current'}")
                continue
            path, stale = build(lab)
        except CatalogError as exc:
            failed += exc.problems
            continue
        except OSError as exc:
            failed.append(f"{lab}: {exc}; fix: python tools/zh_catalog.py skeleton {lab}")
            continue
        print(f"build: {path.relative_to(ROOT)}" + (" (needs executing)" if stale else ""))
        if stale or (command == "execute" and names):
            to_run.append(path)
    for path in to_run if command == "execute" else []:
        try:
            execute(path)
            print(f"execute: {path.relative_to(ROOT)}")
        except subprocess.CalledProcessError:
            failed.append(f"{path.stem}: notebooks/zh/{path.name} failed to execute (nbconvert's "
                          f"error above)")
    if command == "build" and to_run:
        print("labs whose code changed, to execute (make zh): "
              + " ".join(p.stem for p in to_run))
    for line in failed:
        print(f"error: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
