"""Rebuild ``data/corpus.txt`` (the text lab corpus) from CPython's own documentation.

The text is the "Execution model", "The import system", "Exceptions", compound statements and a
few more chapters of the Python Language Reference, as CPython ships them inside the standard
library (``pydoc_data/topics.py``, the text ``help()`` shows), copied verbatim. The committed
``corpus.txt`` was made with CPython 3.11.7; other versions give slightly different text, which
is why the file is stored rather than rebuilt at run time.

    .venv/bin/python data/make_corpus.py   # rewrites data/corpus.txt
"""
import pathlib
import sys

import pydoc_data.topics

# Prose-heavy topics, in reading order (see data/README.md).
TOPICS = ("execmodel", "naming", "import", "exceptions", "try", "raise", "with", "function",
          "class", "calls", "assignment", "comparisons", "objects")


def build():
    return "\n\n".join(pydoc_data.topics.topics[name].strip() for name in TOPICS) + "\n"


if __name__ == "__main__":
    out = pathlib.Path(__file__).with_name("corpus.txt")
    text = build()
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out} ({len(text)} characters, Python {sys.version.split()[0]})")
