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
import subprocess
import sys
from pathlib import Path

import polib

# Run as a script or loaded from its path by the tests: either way its sibling modules import.
sys.path.insert(0, str(Path(__file__).resolve().parent))
# (the names the tests and the migration use from here come along)
from zh_build import (LANGUAGE_CELL, LANGUAGE_CELL_ID, NOTICE, cell_text,  # noqa: E402,F401
                      is_fuzzy, keep_outputs, needs_execution, notebook, notebook_text,
                      rewrite_links, stale_cells)
from zh_code import carry_code, code_difference, needs_entry, source  # noqa: E402,F401

ROOT = Path(__file__).resolve().parent.parent
EN_DIR = ROOT / "notebooks"
CATALOG_DIR = ROOT / "translations" / "zh"
ZH_DIR = EN_DIR / "zh"


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


# -- building (zh_build.py) ---------------------------------------------------------------------
class CatalogError(Exception):
    """A catalog that cannot be built; ``problems`` lists every problem found."""

    def __init__(self, problems):
        super().__init__("\n".join(problems))
        self.problems = problems


def build_notebook(lab: str, en_nb: dict, po: polib.POFile, lab_names: set[str] | None = None,
                   old: dict | None = None, verify: bool = True) -> dict:
    """The Chinese notebook of ``lab`` (zh_build.notebook). Raises CatalogError unless
    ``verify`` is false (the caller has checked)."""
    problems = catalog_problems(lab, en_nb, po) if verify else []
    if problems:
        raise CatalogError(problems)
    return notebook(en_nb, po, set(labs()) if lab_names is None else lab_names, old)


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
