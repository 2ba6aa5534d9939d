"""Students' working copies of the labs, so that a run or an exercise never touches notebooks/.

`make lab` opens JupyterLab on ``my-labs/`` (``my-labs/zh/`` for the Chinese edition,
``make lab EDITION=zh``), a git-ignored folder with the same layout as ``notebooks/``: each lab
is copied there on first use, with its outputs cleared (students run it; the executed reference
stays in ``notebooks/``, which nbval checks and the site shows). A copy that exists is never overwritten, so a student's edits
and saved outputs survive ``git pull``; a lab added later is copied the next time.
``make reset`` (or ``make reset LAB=04a_ddp_from_scratch``; ``EDITION=zh``: the Chinese copies)
restores copies from the reference.

    python tools/student_copies.py sync  [--edition en|zh] [--dest DIR]
    python tools/student_copies.py reset [--edition en|zh] [--dest DIR] [LAB ...]

Relative links keep working: ``my-labs/`` and ``my-labs/zh/`` sit at the depth of
``notebooks/`` and ``notebooks/zh/``, so ``../README.md`` and ``../../data/`` still resolve.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "my-labs"


def source_dir(edition: str) -> Path:
    return ROOT / "notebooks" / ("zh" if edition == "zh" else "")


def dest_dir(edition: str, dest: Path = DEST) -> Path:
    return dest / "zh" if edition == "zh" else dest


def student_copy(path: Path):
    """The notebook at ``path`` with every output and execution count cleared."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def labs(edition: str) -> list[Path]:
    return sorted(source_dir(edition).glob("*.ipynb"))


def sync(edition: str = "en", dest: Path = DEST) -> list[str]:
    """Copy every lab that has no copy yet; returns the names copied."""
    out = dest_dir(edition, dest)
    out.mkdir(parents=True, exist_ok=True)
    copied = []
    for path in labs(edition):
        if not (out / path.name).exists():
            nbformat.write(student_copy(path), out / path.name)
            copied.append(path.stem)
    return copied


def reset(names=(), edition: str = "en", dest: Path = DEST) -> list[str]:
    """Overwrite the copies of ``names`` (every lab when empty) with fresh ones."""
    known = {p.stem: p for p in labs(edition)}
    unknown = [n for n in names if n.removesuffix(".ipynb") not in known]
    if unknown:
        raise SystemExit(f"no lab named {', '.join(unknown)}; the labs are: {', '.join(known)}")
    out = dest_dir(edition, dest)
    out.mkdir(parents=True, exist_ok=True)
    chosen = [n.removesuffix(".ipynb") for n in names] or list(known)
    for name in chosen:
        nbformat.write(student_copy(known[name]), out / f"{name}.ipynb")
    return chosen


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("sync", "reset"))
    parser.add_argument("labs", nargs="*", help="reset only: lab names (default: every lab)")
    parser.add_argument("--edition", choices=("en", "zh"), default="en")
    parser.add_argument("--dest", type=Path, default=DEST)
    args = parser.parse_intermixed_args(argv)
    if args.command == "sync":
        if args.labs:
            parser.error("sync copies every missing lab; name labs only with reset")
        copied = sync(args.edition, args.dest)
        if copied:
            print(f"copied {len(copied)} lab(s) to {dest_dir(args.edition, args.dest).name}/ "
                  "(your working copies; notebooks/ keeps the reference)")
    else:
        done = reset(args.labs, args.edition, args.dest)
        print(f"restored {len(done)} lab(s) from the reference: {', '.join(done)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
