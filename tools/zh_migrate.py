"""``python tools/zh_catalog.py migrate``: the Markdown-like catalogs of issue 18
(``translations/zh/<lab>.md``) become gettext catalogs (``<lab>.po``), losing nothing.

The old format, one block per cell::

    @@ cell <cell id> <markdown|code> en=<first 12 hex of sha256 of the English it translated>
    <the Chinese cell source>

An entry whose hash is the English cell's now becomes a translated entry (msgid: that English).
One whose English changed since: a code cell whose comments and strings still stand, in order,
takes its Chinese over; otherwise it becomes fuzzy, with the English it translated (the newest
version of the notebook in git whose cell has that hash) as its previous msgid, or with none if
git does not have it. An entry of a cell the English no longer has becomes obsolete. Then the
catalog is synced (``zh_catalog.merge``: new cells untranslated) and the .md removed. A .md is the
newer text: it replaces a .po of the same lab; with no .md left, migrate changes nothing.
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess

import polib
import zh_catalog as zc
from zh_code import carry_code, source

MARKER = re.compile(r"^@@ cell (\S+) (markdown|code) en=([0-9a-f]{12})$")


def en_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def parse(text: str) -> dict[str, dict]:
    """{cell id: {"type", "en", "zh"}} from an old catalog's text."""
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


def old_english(lab: str, cid: str, want: str, depth: int = 200) -> str | None:
    """The source of cell ``cid`` in the newest committed version of the English notebook whose
    cell hashes to ``want`` (the English the old entry translated)."""
    rel = f"notebooks/{lab}.ipynb"
    revs = subprocess.run(["git", "log", f"-{depth}", "--format=%H", "--", rel], cwd=zc.ROOT,
                          capture_output=True, text=True).stdout.split()
    for rev in ["HEAD"] + revs:
        shown = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=zc.ROOT, capture_output=True,
                               text=True)
        if shown.returncode:
            continue
        for cell in json.loads(shown.stdout)["cells"]:
            if cell.get("id") == cid and en_hash(source(cell)) == want:
                return source(cell)
    return None


def convert(lab: str, text: str) -> tuple[polib.POFile, list[str]]:
    """The .po of an old catalog's text, and a line for every entry that did not come over as
    translated."""
    en_nb = zc.read_notebook(zc.EN_DIR / f"{lab}.ipynb")
    cells = {c.get("id"): c for c in en_nb["cells"]}
    po, notes = zc.new_catalog(lab), []
    for cid, old in parse(text).items():
        cell = cells.get(cid)
        now = source(cell) if cell else None
        entry = polib.POEntry(msgctxt=cid, msgid=now or "", msgstr=old["zh"], comment=old["type"])
        if now is not None and en_hash(now) == old["en"]:
            po.append(entry)
            continue
        was = old_english(lab, cid, old["en"])
        if now is None:
            entry.msgid, entry.obsolete = was or f"(English of cell {cid} not found)", True
            notes.append(f"{lab}: cell {cid} is gone from the English: kept as obsolete")
        elif old["type"] == "code" and was is not None and carry_code(was, old["zh"], now):
            entry.msgstr = carry_code(was, old["zh"], now)
        else:
            entry.flags.append("fuzzy")
            entry.previous_msgid = was
            notes.append(f"{lab}: cell {cid} ({old['type']}) changed since it was translated: "
                         f"fuzzy" + ("" if was else " (the English it translated is not in git)"))
        po.append(entry)
    return zc.merge(po, en_nb), notes


def main(names: list[str]) -> int:
    olds = sorted(zc.CATALOG_DIR.glob("*.md"))
    olds = [p for p in olds if p.stem in set(names or zc.labs())]
    for path in olds:
        po, notes = convert(path.stem, path.read_text(encoding="utf-8"))
        zc.write_catalog(path.stem, po)
        path.unlink()
        translated = sum(1 for e in po if e.translated())
        print(f"migrate: {path.name} -> {path.stem}.po ({translated} translated, "
              f"{len(notes)} not)")
        for line in notes:
            print("    " + line)
    if not olds:
        print("migrate: no translations/zh/<lab>.md left; nothing to do")
    return 0
