"""The Chinese of what labutils prints: gettext catalogs beside the code that prints it.

Every ``tr("English template", ...)`` call in ``labutils/<package>/`` has its entry in
``labutils/<package>/locale/zh.po`` (Babel's extractor finds the calls: keyword ``tr``); a
template that several packages use lives in the lowest one (``course.LAYERS``), so each
template has one entry. The course map's text (``course.markdown_table``: its header, each
lab's ``chapter``, ``shows`` and ``device``) is in ``labutils/locale/zh.po`` under
``msgctxt "course map"``; data labels marked ``N_("...")`` (a variant's name that stays the
English key, shown by ``label()``) are under ``msgctxt "label"``.
``core/i18n.py`` reads the catalogs with polib when it is imported: no compiled .mo to keep in
step, and the forkserver's ranks inherit the loaded table.

    python tools/zh_messages.py update     # msgmerge: new templates untranslated, changed fuzzy
    python tools/zh_messages.py check      # every template translated, placeholders equal
    python tools/zh_messages.py migrate    # core/_zh.py's MESSAGES and COURSE_* -> the catalogs

``update`` is Babel's ``Catalog.update`` (a changed template becomes fuzzy with its previous
msgid; a vanished one obsolete); a template that moved to another package takes its Chinese
along. ``check`` fails on an untranslated or fuzzy template (tr falls back to English for
both, so a test would see English in a Chinese notebook), on a ``python-brace-format`` entry
whose Chinese has other placeholders (and runs ``msgfmt --check-format`` when gettext is
installed), and on a catalog that ``update`` would change. ``migrate`` rebuilds the catalogs from
``core/_zh.py`` (it is the newer text where it exists), deletes it, and names any module that
still imports it; with no ``_zh.py`` it only updates.
"""
from __future__ import annotations

import contextlib
import io
import re
import runpy
import shutil
import string
import subprocess
import sys
from pathlib import Path

from babel.messages.catalog import Catalog, Message
from babel.messages.extract import extract_from_dir
from babel.messages.pofile import read_po, write_po

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "labutils"
OLD = PACKAGE / "core" / "_zh.py"
COURSE = "course map"
LABEL = "label"      # data labels, marked N_("...") where defined (core/i18n.py's label())
HEADER = ("Simplified Chinese of what labutils prints: the tr() templates of this package "
          "(tools/zh_messages.py).")


def fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def _layers() -> tuple[str, ...]:
    sys.path.insert(0, str(ROOT))
    from labutils import course
    return course.LAYERS


def extract(keyword: str = "tr") -> dict[str, dict[str, None]]:
    """{template: the files whose code passes it to ``keyword`` (tr, or N_ for data labels), in
    order}, in the order of the code."""
    used: dict[str, dict[str, None]] = {}
    # Babel writes a warning for every f-string passed as a keyword value (tr's values, which
    # are not messages): nothing to report.
    with contextlib.redirect_stderr(io.StringIO()):
        for filename, _, message, _, _ in extract_from_dir(
                str(PACKAGE), method_map=[("**.py", "python")], keywords={keyword: None},
                comment_tags=()):
            used.setdefault(message, {})[filename] = None
    return used


def _package(filename: str) -> str:
    parts = Path(filename).parts
    return parts[0] if len(parts) > 1 else ""  # "": labutils' own modules (course.py)


def catalog_path(package: str) -> Path:
    return PACKAGE / package / "locale" / "zh.po"


def course_texts() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from labutils import course
    texts = [*course.HEADER, course.COMING, *(lab.chapter for lab in course.LABS),
             *(lab.shows for lab in course.LABS),
             *(lab.device for lab in course.LABS)]
    return list(dict.fromkeys(texts))


def templates() -> dict[str, Catalog]:
    """{package: a catalog holding the templates it owns, untranslated}."""
    order = {name: i for i, name in enumerate(_layers() + ("",))}
    out: dict[str, Catalog] = {}
    for keyword, context in (("tr", None), ("N_", LABEL)):
        for message, files in extract(keyword).items():
            owner = min((_package(f) for f in files), key=lambda p: order.get(p, len(order)))
            out.setdefault(owner, new_catalog()).add(  # locations: who prints it, for the
                message, context=context, locations=[(f, None) for f in files])  # translator
    for text in course_texts():
        out.setdefault("", new_catalog()).add(text, context=COURSE)
    return out


def new_catalog() -> Catalog:
    return Catalog(locale="zh_CN", project="labutils", header_comment="# " + HEADER,
                   language_team="zh_CN", fuzzy=False)


def read(package: str) -> Catalog:
    with open(catalog_path(package), "rb") as f:
        return read_po(f, locale="zh_CN")


def render(catalog: Catalog) -> str:
    for message in catalog:
        if message.id:  # brace placeholders, never %: msgfmt must check only what tr uses
            message.flags.discard("python-format")
            if fields(message.id):
                message.flags.add("python-brace-format")
    buf = io.BytesIO()
    write_po(buf, catalog, width=0, include_previous=True, include_lineno=False)
    return _join_previous(buf.getvalue().decode("utf-8"))


def _join_previous(text: str) -> str:
    """Babel wraps a long previous msgid (``#| msgid "..."``, a fuzzy entry's old English) at 76
    columns whatever ``width`` says, and its continuation lines are no PO syntax (``#| words``),
    which polib then refuses; join them back onto their ``#| msgid`` line."""
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        if (line.startswith("#| ") and not line.startswith(('#| msgid', '#| msgctxt', '#| "'))
                and out and out[-1].startswith("#| ")):
            out[-1] = out[-1].rstrip("\n") + " " + line[3:]
        else:
            out.append(line)
    return "".join(out)


def merged(known: dict[tuple, str] | None = None) -> dict[str, str]:
    """{package: the text its catalog should have}: the existing catalogs merged with the
    templates, or, given ``known`` ({(context, English): Chinese}, a migration), rebuilt."""
    new = templates()
    pool: dict[tuple, str] = {}
    packages = set(new) | {path.parent.parent.name for path in PACKAGE.glob("*/locale/zh.po")}
    existing = {p: read(p) for p in packages if catalog_path(p).exists()}
    for catalog in existing.values():  # every Chinese on record, obsolete included
        for m in [*catalog, *catalog.obsolete.values()]:
            if m.id and m.string and not m.fuzzy:
                pool.setdefault((m.context, m.id), m.string)
    out = {}
    for package, template in new.items():
        if known is not None or package not in existing:
            catalog = new_catalog()
            for m in template:
                if m.id:
                    catalog.add(m.id, context=m.context, locations=m.locations)
        else:
            catalog = existing[package]
            created = catalog.creation_date
            catalog.update(template, update_creation_date=False)
            catalog.creation_date = created
        table = pool if known is None else known
        for m in catalog:
            if m.id and not m.string and (m.context, m.id) in table:
                m.string = table[m.context, m.id]
        out[package] = render(catalog)
    return out


def update() -> list[Path]:
    changed = []
    for package, text in merged().items():
        path = catalog_path(package)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def check(msgfmt: bool = True) -> list[str]:
    """Every problem of the message catalogs, one line each with its fix."""
    problems = []
    for package, text in merged().items():
        path = catalog_path(package)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            problems.append(f"{path.relative_to(ROOT)} is not in step with the tr() calls; fix: "
                            f"python tools/zh_messages.py update")
            continue
        problems += catalog_problems(path, msgfmt)
    return problems


def catalog_problems(path: Path, msgfmt: bool = True) -> list[str]:
    """An entry without Chinese (or fuzzy), or whose Chinese has other placeholders than its
    English; and msgfmt's format check, where gettext is installed."""
    with open(path, "rb") as f:
        catalog = read_po(f, locale="zh_CN")
    problems, where = [], path.name if not path.is_relative_to(ROOT) else path.relative_to(ROOT)
    for m in catalog:
        if not m.id:
            continue
        if not m.string or m.fuzzy:
            problems.append(f"{where}: no Chinese for {m.id!r}" + (" (fuzzy)" if m.fuzzy else "")
                            + "; fix: translate it (and remove '#, fuzzy')")
        elif fields(m.string) != fields(m.id):
            problems.append(f"{where}: {m.id!r}: the Chinese has the placeholders "
                            f"{sorted(fields(m.string))}, the English {sorted(fields(m.id))}")
    if msgfmt and shutil.which("msgfmt"):
        done = subprocess.run(["msgfmt", "--check-format", "-o", "/dev/null", str(path)],
                              capture_output=True, text=True)
        if done.returncode:
            problems.append(f"{where}: msgfmt --check-format: {done.stderr.strip()}")
    return problems


_IMPORT = re.compile(r"^\s*(from labutils\.core import .*\b_zh\b|from labutils\.core\._zh import|"
                     r"import labutils\.core\._zh)", re.M)


def migrate() -> int:
    if not OLD.exists():
        print(f"migrate: no {OLD.relative_to(ROOT)}; updating the catalogs only")
    else:
        old = runpy.run_path(str(OLD))
        known = {(None, k): v for k, v in old["MESSAGES"].items()}
        course_en = course_texts()
        from labutils import course
        known.update({(COURSE, en): zh for en, zh in zip(course.HEADER, old["COURSE_HEADER"])})
        known[COURSE, course.COMING] = old["COURSE_COMING"]
        known.update({(COURSE, k): v for k, v in {**old["COURSE_SHOWS"],
                                                   **old["COURSE_DEVICES"]}.items()})
        texts = merged(known)
        placed = {(m.context, m.id) for text in texts.values()
                  for m in read_po(io.BytesIO(text.encode()))}
        left = [k for k in known if k not in placed]
        if left:  # Chinese no code uses: kept as obsolete in core's catalog, not lost
            core = read_po(io.BytesIO(texts["core"].encode()))
            for context, en in left:
                core.obsolete[en if context is None else (en, context)] = Message(
                    en, known[context, en], context=context)
            texts["core"] = render(core)
            print(f"migrate: {len(left)} Chinese message(s) no tr() uses, kept as obsolete in "
                  f"labutils/core/locale/zh.po: {[en for _, en in left]}")
        for package, text in texts.items():
            catalog_path(package).parent.mkdir(parents=True, exist_ok=True)
            catalog_path(package).write_text(text, encoding="utf-8")
            print(f"migrate: {catalog_path(package).relative_to(ROOT)}")
        OLD.unlink()
        print(f"migrate: removed {OLD.relative_to(ROOT)} ({len(known)} messages moved; "
              f"{len(course_en)} course-map texts)")
    update()
    importers = [str(p.relative_to(ROOT)) for folder in ("labutils", "tests", "tools")
                 for p in (ROOT / folder).rglob("*.py") if _IMPORT.search(p.read_text("utf-8"))]
    if importers:
        print("error: still importing core._zh (use core.i18n.translate or the catalogs): "
              + ", ".join(importers), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int | str:
    if argv == ["update"]:
        for path in update():
            print(f"update: {path.relative_to(ROOT)}")
        return 0
    if argv == ["check"]:
        problems = check()
        for line in problems:
            print(line)
        print(f"{len(problems)} problem(s) in the message catalogs",
              file=sys.stderr if problems else sys.stdout)
        return 1 if problems else 0
    if argv == ["migrate"]:
        return migrate()
    return __doc__


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
