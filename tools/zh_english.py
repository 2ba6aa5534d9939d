"""English sentences in the Chinese edition's stored outputs: what a student still reads in
English once every cell is translated. `make release` runs it and fails on any; before that,
`python tools/zh_english.py [LAB ...]` prints the count per lab (and `-v` each line).

A line of output counts when, after the allow-list is masked, it still holds an English
sentence: four or more English words in a row, at least three of them lower-case words of three
letters or more (a table header such as "step ms  speedup  floor that binds" counts too; the
mesh dimensions "pp, dp, cp, tp" do not). Masked, never counted:

* code: the outputs of ``lu.show_source`` / ``lu.show_solution`` cells (a listing is code, its
  comments included), spans in backticks or quotes (a repr, a name: 「2 ranks」, 'ring'),
  identifiers (``all_reduce``, ``dist.all_reduce(...)``, ``world_size=2``), paths and file names;
* names and units (``NAMES``, ``UNITS``): products, papers, people, ``ms``, ``MiB``, ``GB/s``;
* messages of PyTorch and Python themselves (``FOREIGN``): a library's error is shown as it is;
* figures and widgets (images, widget views): their text is drawn, not printed.
"""
from __future__ import annotations

import argparse
import html
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZH_DIR = ROOT / "notebooks" / "zh"

# names that may stand in a Chinese sentence as they are (several words each)
NAMES = ("Mann-Whitney", "Hogwild", "PyTorch", "Megatron", "GPipe", "GShard", "DeviceMesh",
         "Switch Transformer", "Ulysses", "DeepSpeed", "ZeRO", "FSDP2", "FSDP", "DTensor",
         "Zero Bubble", "ZBV", "OpenMP", "JupyterLab", "Jupyter", "NumPy", "SciPy")
UNITS = ("ms", "s", "us", "µs", "ns", "B", "KiB", "MiB", "GiB", "KB", "MB", "GB", "TB",
         "GB/s", "MB/s", "Gb/s", "Mb/s", "FLOP", "FLOPs", "GFLOP/s", "TFLOP/s", "MFLOP",
         "rank", "ranks", "step", "steps")
# what PyTorch and Python print themselves, in English in every edition
FOREIGN = (re.compile(r"SyncBatchNorm expected input tensor to be on"),
           re.compile(r"Can't get attribute '\w+' on <module"),
           re.compile(r"ChildFailedError"),
           re.compile(r"Traceback \(most recent call last\)"))

_MASKS = (
    re.compile(r"「[^」]*」|『[^』]*』|`[^`]*`|'[^'\n]*'|\"[^\"\n]*\"|“[^”]*”"),  # quoted
    re.compile(r"(?:[\w.]*/[\w./<>-]+)"),                                   # paths, units a/b
    re.compile(r"\b\w+(?:[._]\w+)+(?:\([^)]*\))?"),                         # identifiers
    re.compile(r"\b\w+\([^)]*\)"),                                          # calls
    re.compile(r"\b\w+=\S+"),                                               # key=value
)
_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*")
_GAP = re.compile(r"[ ,;:()\[\]]+|\.(?= )|\.$")


def _mask_names(line):
    for name in sorted(NAMES, key=len, reverse=True):
        line = line.replace(name, " ")
    return line


def english_sentences(line):
    """The English sentences left in one line of output once the allow-list is masked."""
    if any(p.search(line) for p in FOREIGN):
        return []
    for mask in _MASKS:
        line = mask.sub(" ", line)
    line = _mask_names(line)
    found, run = [], []

    def close():
        words = [w for w in run if w not in UNITS]
        if len(run) >= 4 and sum(w.islower() and len(w) > 2 for w in words) >= 3:
            found.append(" ".join(run))
        run.clear()
    for token in re.split(r"(\s+|[,;:()\[\]]|[^\sA-Za-z'’,;:()\[\]-]+)", line):
        if not token or token.isspace() or token in ",;:()[]":
            continue
        if _WORD.fullmatch(token):
            run.append(token)
        else:
            close()
    close()
    return found


def _is_listing(source):
    return bool(re.search(r"\bshow_(source|solution)\(", source))


def output_texts(output):
    """The text a student reads in one output (no images, no widget views)."""
    kind = output.get("output_type")
    if kind == "stream":
        return ["".join(output.get("text", ""))]
    if kind == "error":
        return [f"{output.get('ename', '')}: {output.get('evalue', '')}"]
    data = output.get("data", {})
    if "application/vnd.jupyter.widget-view+json" in data:
        return []
    for mime in ("text/markdown", "text/html", "text/plain"):
        if mime in data:
            text = "".join(data[mime])
            if mime == "text/html":
                text = html.unescape(re.sub(r"<[^>]+>", " ", text))
            if mime == "text/plain" and re.fullmatch(r"<Figure size [^>]*>", text.strip()):
                return []
            return [text]
    return []


def scan_notebook(nb):
    """[(cell index, line, sentences)] for each output line of ``nb`` holding English."""
    hits = []
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code" or _is_listing("".join(cell["source"])):
            continue
        for output in cell.get("outputs", []):
            for text in output_texts(output):
                for line in text.splitlines():
                    if sentences := english_sentences(line):
                        hits.append((index, line.strip(), sentences))
    return hits


def scan(labs=None):
    """{lab: hits} for the Chinese notebooks (all, or those named)."""
    paths = sorted(ZH_DIR.glob("*.ipynb"))
    if labs:
        paths = [p for p in paths if p.stem in labs]
    return {p.stem: scan_notebook(json.loads(p.read_text(encoding="utf-8"))) for p in paths}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("labs", nargs="*")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each line")
    args = parser.parse_args(argv)
    found = scan(args.labs)
    for lab, hits in found.items():
        print(f"{lab}: {len(hits)} output line(s) with English sentences")
        for index, line, _ in hits if args.verbose else ():
            print(f"  [{index}] {line[:160]}")
    total = sum(len(h) for h in found.values())
    print(f"{total} output line(s) with English sentences in {len(found)} Chinese lab(s)"
          + ("" if total == 0 else "; translate the strings the cells print "
             "(translations/zh/<lab>.po) or labutils' messages (tr())"))
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
