"""The translation catalog of the Chinese edition: one text file per lab, ``translations/zh/<lab>.md``.

Format (plain UTF-8 text, friendly to review and diff)::

    Anything before the first marker is a comment for the translator.
    @@ cell <cell id> <markdown|code> en=<first 12 hex of sha256 of the English cell source>
    <the Chinese cell source, as it will stand in notebooks/zh/<lab>.ipynb (links: see below)>
    @@ cell ...

A cell's text runs from the line after its marker to the line before the next marker, with
trailing blank lines dropped. ``en=`` records which English text was translated: when the English
cell changes, its hash no longer matches and the drift check names the cell.

Which cells need an entry: every markdown cell, and every code cell with a comment (other than
nbval markers) or a string literal holding a sentence (two English words in a row). Code cells
without an entry are copied unchanged. A code cell's translation may differ from the English only
in comments and string literals (checked token by token), so the Chinese edition runs the same
code.

Links keep the English targets (relative to notebooks/): ``build`` rewrites those that leave
notebooks/ (``../labutils/...``, ``../README.md``, ``../data/...``) one level up, so that they
resolve from notebooks/zh/; links between labs stay as they are (the Chinese labs have the same
file names). The built notebook has the English notebook's cells, ids and metadata, with one code
cell added before the first code cell (id ``zh-language``: ``lu.set_language("zh")``), and no
outputs until ``execute`` runs it.

    python tools/zh_catalog.py skeleton 01_introduction    # write a catalog to translate
    python tools/zh_catalog.py check                       # every problem of every lab; exit 1
    python tools/zh_catalog.py build [LAB ...]             # notebooks/zh/<lab>.ipynb, not executed
    python tools/zh_catalog.py execute [LAB ...]           # build, then execute in place (make zh)
    python tools/zh_catalog.py carry [LAB ...]             # carry Chinese comments onto new code

``carry`` updates the entries of code cells whose English changed: it finds the English that was
translated (the version of the notebook in git whose cell has the entry's hash), and when every
comment and string of the new English cell also stood in that old English, it writes the new
code with the old Chinese comments and strings in their place and sets ``en=``. It lists the
cells it could not carry (new or changed comments, strings, markdown): translate those by hand.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
import tokenize
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
EN_DIR = ROOT / "notebooks"
CATALOG_DIR = ROOT / "translations" / "zh"
ZH_DIR = EN_DIR / "zh"
LANGUAGE_CELL_ID = "zh-language"
# The cell that makes labutils print Chinese (checkers, panels, timing verdicts).
LANGUAGE_CELL = ("# 中文版：让 labutils 输出的文字（检查器、控制面板、计时结论）使用中文\n"
                 "import labutils as lu\n"
                 "lu.set_language(\"zh\")")
_MD_LINK = re.compile(r"(\]\(\s*<?)([^)\s>]+)")
_HTML_LINK = re.compile(r"""(\b(?:href|src)\s*=\s*["'])([^"']+)""")
MARKER = re.compile(r"^@@ cell (\S+) (markdown|code) en=([0-9a-f]{12})$")
_SENTENCE = re.compile(r"[A-Za-z]{2,}[ ,:;.()'-]+[A-Za-z]{2,}")
_NBVAL = re.compile(r"^#\s*NBVAL_")


def source(cell) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def en_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _tokens(code: str):
    """Python tokens of a cell, with IPython magic and shell lines kept as opaque lines."""
    lines = code.splitlines(keepends=True)
    magic = [ln for ln in lines if ln.lstrip().startswith(("%", "!"))]
    plain = "".join("\n" if ln.lstrip().startswith(("%", "!")) else ln for ln in lines)
    toks = list(tokenize.generate_tokens(io.StringIO(plain).readline))
    return magic, toks


def translatable(code: str) -> bool:
    """True when a code cell has a comment or a sentence in a string that a reader sees."""
    _, toks = _tokens(code)
    for t in toks:
        if t.type == tokenize.COMMENT and not _NBVAL.match(t.string):
            return True
        if t.type == tokenize.STRING and _SENTENCE.search(t.string):
            return True
    return False


def code_difference(en: str, zh: str) -> str | None:
    """None when ``zh`` is ``en`` with only comments and string literals changed, else a line
    that says where they differ."""
    try:
        m_en, t_en = _tokens(en)
        m_zh, t_zh = _tokens(zh)
    except (tokenize.TokenError, SyntaxError, IndentationError) as exc:
        return f"the translated code does not tokenize: {exc}"
    if m_en != m_zh:
        return "a magic or shell line (% or !) differs"
    skip = {tokenize.COMMENT, tokenize.STRING, tokenize.NL, tokenize.NEWLINE,
            tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    a = [(t.type, t.string) for t in t_en if t.type not in skip]
    b = [(t.type, t.string) for t in t_zh if t.type not in skip]
    # Statement structure must match too: the same NEWLINE/INDENT/DEDENT sequence.
    sa = [t.type for t in t_en if t.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)]
    sb = [t.type for t in t_zh if t.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)]
    na = sum(t.type == tokenize.STRING for t in t_en)
    nb = sum(t.type == tokenize.STRING for t in t_zh)
    if a != b or sa != sb or na != nb:
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"code differs from the English at token {i}: {x[1]!r} vs {y[1]!r}"
        return "code differs from the English (a statement or string added or removed)"
    return None


def needs_entry(cell) -> bool:
    return cell["cell_type"] == "markdown" or (
        cell["cell_type"] == "code" and translatable(source(cell)))


def parse(text: str) -> dict[str, dict]:
    """{cell id: {"type", "en", "zh"}} from a catalog's text."""
    entries, current, lines = {}, None, []

    def close():
        if current is not None:
            body = "\n".join(lines).rstrip("\n").rstrip()
            entries[current[0]] = {"type": current[1], "en": current[2], "zh": body}

    for line in text.splitlines():
        m = MARKER.match(line)
        if m:
            close()
            if m.group(1) in entries:
                raise ValueError(f"cell {m.group(1)} appears twice in the catalog")
            current, lines = m.groups(), []
        elif current is not None:
            lines.append(line)
    close()
    return entries


def skeleton(lab: str) -> str:
    """A catalog holding the English text of every cell that needs an entry, to translate."""
    nb = json.loads((EN_DIR / f"{lab}.ipynb").read_text(encoding="utf-8"))
    out = [f"Translation catalog of {lab} (Simplified Chinese). Replace the text under each marker;",
           "keep the markers; see tools/zh_catalog.py for the rules.", ""]
    for cell in nb["cells"]:
        if needs_entry(cell):
            src = source(cell)
            out += [f"@@ cell {cell['id']} {cell['cell_type']} en={en_hash(src)}", src.rstrip(), ""]
    return "\n".join(out)




# -- checking ------------------------------------------------------------------------------------
def labs() -> list[str]:
    """Every English lab (notebooks/*.ipynb), in file-name order."""
    return sorted(path.stem for path in EN_DIR.glob("*.ipynb"))


def read_notebook(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read_catalog(lab: str, catalog_dir: Path = CATALOG_DIR) -> dict[str, dict]:
    return parse((Path(catalog_dir) / f"{lab}.md").read_text(encoding="utf-8"))


def catalog_problems(lab: str, en_nb: dict, entries: dict[str, dict]) -> list[str]:
    """Every problem of one lab's catalog against its English notebook, one line each, naming the
    cell and the fix: a missing entry, a stale hash (the English changed since it was
    translated), a wrong cell type, a code translation that changes code, an entry for no cell."""
    where = f"translations/zh/{lab}.md"
    problems, ids = [], set()
    for cell in en_nb["cells"]:
        cid, kind, src = cell.get("id"), cell["cell_type"], source(cell)
        if not cid:
            problems.append(f"{lab}: a {kind} cell has no id; fix: save the English notebook "
                            f"with nbformat 4.5 or later (cells get ids)")
            continue
        ids.add(cid)
        entry = entries.get(cid)
        if entry is None:
            if needs_entry(cell):
                problems.append(
                    f"{lab}: cell {cid} ({kind}) has no translation; fix: add to {where} the "
                    f"line '@@ cell {cid} {kind} en={en_hash(src)}' followed by its Chinese text")
            continue
        if entry["type"] != kind:
            problems.append(f"{lab}: cell {cid} is a {kind} cell, the catalog says {entry['type']}; "
                            f"fix: correct its marker in {where}")
            continue
        if entry["en"] != en_hash(src):
            problems.append(
                f"{lab}: cell {cid} ({kind}): the English changed since it was translated "
                f"(catalog en={entry['en']}, English now en={en_hash(src)}); fix: update the "
                f"Chinese text in {where} to the new English, then set en={en_hash(src)} in its "
                f"marker")
            continue
        if kind == "code":
            diff = code_difference(src, entry["zh"])
            if diff:
                problems.append(f"{lab}: cell {cid} (code): {diff}; fix: in {where}, change only "
                                f"comments and string literals")
    for cid in entries:
        if cid not in ids:
            problems.append(f"{lab}: the catalog has cell {cid}, which the English notebook does "
                            f"not have; fix: remove it from {where}")
    if LANGUAGE_CELL_ID in ids:
        problems.append(f"{lab}: an English cell has the id {LANGUAGE_CELL_ID}, which the Chinese "
                        f"edition's language cell uses; fix: give it another id")
    return problems


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


def build_notebook(lab: str, en_nb: dict, entries: dict[str, dict],
                   lab_names: set[str] | None = None) -> dict:
    """The Chinese notebook of ``lab``: the English cells, ids and metadata, text from the
    catalog, the language cell before the first code cell, no outputs. Raises CatalogError."""
    problems = catalog_problems(lab, en_nb, entries)
    if problems:
        raise CatalogError(problems)
    lab_names = set(labs()) if lab_names is None else lab_names
    cells = []
    for cell in en_nb["cells"]:
        cell = json.loads(json.dumps(cell))  # a copy
        entry = entries.get(cell["id"])
        text = entry["zh"] if entry else source(cell)
        if cell["cell_type"] == "markdown":
            text = rewrite_links(text, lab_names)
        cell["source"] = text
        if cell["cell_type"] == "code":
            if not any(c["cell_type"] == "code" for c in cells):
                cells.append({"cell_type": "code", "execution_count": None,
                              "id": LANGUAGE_CELL_ID, "metadata": {}, "outputs": [],
                              "source": LANGUAGE_CELL})
            cell["outputs"], cell["execution_count"] = [], None
            cell["metadata"].pop("execution", None)  # timestamps of the English run
        cells.append(cell)
    metadata = {k: v for k, v in en_nb["metadata"].items() if k != "widgets"}  # widget state
    return {"cells": cells, "metadata": metadata, "nbformat": en_nb["nbformat"],
            "nbformat_minor": en_nb["nbformat_minor"]}


def notebook_text(nb: dict) -> str:
    """As nbformat (and so nbconvert and JupyterLab) writes a notebook."""
    import nbformat
    return nbformat.writes(nbformat.from_dict(nb)) + "\n"


def build(lab: str, force: bool = False) -> Path:
    """Write notebooks/zh/<lab>.ipynb; one whose cells are already the build keeps its outputs
    (an executed notebook survives a build that changes nothing), unless ``force``."""
    nb = build_notebook(lab, read_notebook(EN_DIR / f"{lab}.ipynb"), read_catalog(lab))
    ZH_DIR.mkdir(exist_ok=True)
    path = ZH_DIR / f"{lab}.ipynb"
    if force or not path.exists() or stale_cells(nb, read_notebook(path)):
        path.write_text(notebook_text(nb), encoding="utf-8")
    return path


def stale_cells(built: dict, committed: dict) -> list[str]:
    """Where a committed Chinese notebook's cells differ from what ``build`` makes now (a hand
    edit, or a build older than its catalog or English notebook): one line per cell."""
    want = [(c["id"], c["cell_type"], source(c)) for c in built["cells"]]
    have = [(c.get("id"), c["cell_type"], source(c)) for c in committed["cells"]]
    if [w[0] for w in want] != [h[0] for h in have]:
        return [f"the cells differ in number or order ({len(have)} committed, {len(want)} built)"]
    return [f"cell {w[0]} ({w[1]}) differs from its build" for w, h in zip(want, have) if w != h]


def check(names: list[str] | None = None) -> list[str]:
    """Every problem of every lab: catalogs and committed Chinese notebooks."""
    problems, all_labs = [], labs()
    for lab in names or all_labs:
        if not (CATALOG_DIR / f"{lab}.md").exists():
            problems.append(f"{lab}: no catalog; fix: python tools/zh_catalog.py skeleton {lab}, "
                            f"then translate translations/zh/{lab}.md")
            continue
        try:
            en_nb, entries = read_notebook(EN_DIR / f"{lab}.ipynb"), read_catalog(lab)
        except ValueError as exc:
            problems.append(f"{lab}: translations/zh/{lab}.md: {exc}")
            continue
        found = catalog_problems(lab, en_nb, entries)
        problems += found
        zh_path = ZH_DIR / f"{lab}.ipynb"
        if found:
            continue
        if not zh_path.exists():
            problems.append(f"{lab}: no notebooks/zh/{lab}.ipynb; fix: make zh (or "
                            f"python tools/zh_catalog.py build {lab})")
            continue
        built = build_notebook(lab, en_nb, entries, set(all_labs))
        problems += [f"{lab}: notebooks/zh/{lab}.ipynb: {line}; fix: edit translations/zh/"
                     f"{lab}.md, not the notebook, then make zh"
                     for line in stale_cells(built, read_notebook(zh_path))]
    return problems


def execute(lab: str) -> None:
    """Build, then execute in place as the English labs are (nbconvert). The labs find their data
    through labutils (paths from the repository root), so the working folder may be notebooks/zh/,
    which the relative links of the Chinese notebook are written for."""
    path = build(lab, force=True)
    subprocess.run([sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute",
                    "--inplace", "--ExecutePreprocessor.timeout=600", path.name],
                   cwd=path.parent, check=True)


# -- carrying translations onto changed code -----------------------------------------------------
def _texts(code: str):
    """The comments and string literals of a cell, in order, with their token positions."""
    _, toks = _tokens(code)
    return [t for t in toks if t.type in (tokenize.COMMENT, tokenize.STRING)
            and not (t.type == tokenize.COMMENT and _NBVAL.match(t.string))]


def _old_english(lab: str, cid: str, want: str, depth: int = 40) -> str | None:
    """The source of cell ``cid`` in the most recent committed version of the English notebook
    whose cell hashes to ``want`` (the English the catalog entry translated)."""
    rel = f"notebooks/{lab}.ipynb"
    revs = subprocess.run(["git", "log", f"-{depth}", "--format=%H", "--", rel], cwd=ROOT,
                          capture_output=True, text=True).stdout.split()
    for rev in ["HEAD"] + revs:
        shown = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=ROOT, capture_output=True,
                               text=True)
        if shown.returncode:
            continue
        for cell in json.loads(shown.stdout)["cells"]:
            if cell.get("id") == cid and en_hash(source(cell)) == want:
                return source(cell)
    return None


def carry_code(old_en: str, old_zh: str, new_en: str) -> str | None:
    """``new_en`` with each comment and string replaced by the Chinese that stood for the same
    English text in ``old_zh``; None when a comment or string of ``new_en`` is new."""
    en_t, zh_t = _texts(old_en), _texts(old_zh)
    if len(en_t) != len(zh_t):
        return None
    table = {}
    for e, z in zip(en_t, zh_t):
        if table.setdefault((e.type, e.string), z.string) != z.string:
            return None  # one English text translated two ways: keep it for a human
    lines = new_en.splitlines(keepends=True)
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln))
    out, pos = [], 0
    for t in _texts(new_en):
        key = (t.type, t.string)
        if key not in table:
            return None
        start = offsets[t.start[0] - 1] + t.start[1]
        end = offsets[t.end[0] - 1] + t.end[1]
        out += [new_en[pos:start], table[key]]
        pos = end
    out.append(new_en[pos:])
    return "".join(out)


def write_catalog(lab: str, entries: dict[str, dict], en_nb: dict) -> None:
    """Rewrite a catalog in the English notebook's cell order, keeping its header comment."""
    path = CATALOG_DIR / f"{lab}.md"
    text = path.read_text(encoding="utf-8")
    first = next((i for i, ln in enumerate(text.splitlines()) if MARKER.match(ln)), None)
    header = text.splitlines()[:first] if first is not None else []
    order = [c.get("id") for c in en_nb["cells"]]
    ids = sorted(entries, key=lambda cid: order.index(cid) if cid in order else len(order))
    out = list(header)
    for cid in ids:
        e = entries[cid]
        out += [f"@@ cell {cid} {e['type']} en={e['en']}", e["zh"].rstrip(), ""]
    path.write_text("\n".join(out), encoding="utf-8")


def carry(lab: str) -> list[str]:
    """Carry the Chinese of changed code cells onto their new English; returns what is left
    for a translator (one line per cell)."""
    en_nb, entries = read_notebook(EN_DIR / f"{lab}.ipynb"), read_catalog(lab)
    left, changed = [], False
    for cell in en_nb["cells"]:
        cid, kind, src = cell.get("id"), cell["cell_type"], source(cell)
        entry = entries.get(cid)
        if entry is None or entry["en"] == en_hash(src):
            continue
        if kind == "code":
            old = _old_english(lab, cid, entry["en"])
            new_zh = None if old is None else carry_code(old, entry["zh"], src)
            if new_zh is not None:
                entries[cid] = {"type": kind, "en": en_hash(src), "zh": new_zh}
                changed = True
                continue
        left.append(f"{lab}: cell {cid} ({kind}) changed: translate it by hand in "
                    f"translations/zh/{lab}.md and set en={en_hash(src)}")
    for cell in en_nb["cells"]:
        if cell.get("id") not in entries and needs_entry(cell):
            left.append(f"{lab}: cell {cell.get('id')} ({cell['cell_type']}) is new: add it to "
                        f"translations/zh/{lab}.md with en={en_hash(source(cell))}")
    stale = [cid for cid in entries if cid not in {c.get("id") for c in en_nb["cells"]}]
    for cid in stale:
        left.append(f"{lab}: the catalog's cell {cid} is gone from the English: remove it")
    if changed:
        write_catalog(lab, entries, en_nb)
    return left


def main(argv: list[str]) -> int:
    command, names = (argv[0], argv[1:]) if argv else ("", [])
    unknown = [n for n in names if not (EN_DIR / f"{n}.ipynb").exists()]
    if command == "skeleton" and len(names) == 1 and not unknown:
        CATALOG_DIR.mkdir(parents=True, exist_ok=True)
        path = CATALOG_DIR / f"{names[0]}.md"
        if path.exists():
            return f"{path} exists; not overwritten"
        path.write_text(skeleton(names[0]), encoding="utf-8")
        print(path)
        return 0
    if command == "carry" and not unknown:
        left = [line for lab in names or labs() for line in carry(lab)]
        for line in left:
            print(line)
        print(f"{len(left)} cell(s) left to translate by hand")
        return 0
    if command not in ("check", "build", "execute") or unknown:
        return (f"no such lab: {', '.join(unknown)}\n" if unknown else "") + __doc__
    if command == "check":
        problems = check(names)
        for line in problems:
            print(line)
        print(f"{len(problems)} problem(s) in {len(names or labs())} lab(s)",
              file=sys.stderr if problems else sys.stdout)
        return 1 if problems else 0
    failed = []
    for lab in names or labs():
        try:
            path = build(lab) if command == "build" else execute(lab) or ZH_DIR / f"{lab}.ipynb"
        except CatalogError as exc:
            failed += exc.problems
            continue
        except subprocess.CalledProcessError:
            failed.append(f"{lab}: notebooks/zh/{lab}.ipynb failed to execute (nbconvert's "
                          f"error above)")
            continue
        except FileNotFoundError as exc:
            failed.append(f"{lab}: {exc.filename} not found; fix: python tools/zh_catalog.py "
                          f"skeleton {lab}, then translate it")
            continue
        print(f"{command}: {path.relative_to(ROOT)}")
    for line in failed:
        print(f"error: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
