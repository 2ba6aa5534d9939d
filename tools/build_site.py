"""Build the static course site: every notebook with its stored outputs (no re-execution) as an
HTML page, README.md as the index, links between pages rewritten to the HTML pages.

    python tools/build_site.py [--out _site]        # or: make site

Layout mirrors the repository: ``notebooks/NN_name.ipynb`` becomes ``notebooks/NN_name.html``,
``README.md`` becomes ``index.html``, another linked ``.md`` becomes ``.html``, and any other
local file a page links to (an image, a ``labutils`` source file) is copied. Each lab page gets
a bar with links to the course map and to the previous and next lab. Knob panels cannot run
in a static page: their output becomes a note saying to open the lab in JupyterLab.
Tested by ``tests/test_site.py`` (every notebook has a page, every local link resolves).
"""
from __future__ import annotations

import argparse
import copy
import html
import os
import re
import shutil
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import mistune
import nbformat
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parent.parent
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_LINK = re.compile(r'(\s(?:href|src)=")([^"]*)(")')
_STYLE = """
body.lu-page { max-width: 60rem; margin: 2rem auto; padding: 0 1rem;
  font-family: system-ui, sans-serif; line-height: 1.5; }
.lu-page table { border-collapse: collapse; font-size: 0.9rem; }
.lu-page th, .lu-page td { border: 1px solid #ccc; padding: 0.3rem 0.5rem; vertical-align: top; }
.lu-page pre { background: #f5f5f5; padding: 0.6rem; overflow-x: auto; }
.lu-nav { display: flex; gap: 1.5rem; padding: 0.5rem 1rem; background: #f0f4f8;
  border-bottom: 1px solid #ccd; font-family: system-ui, sans-serif; }
.lu-static-panel { border: 1px dashed #99a; padding: 0.4rem 0.8rem; color: #445; }
"""


def _is_local(url):
    parts = urlsplit(url)
    return bool(url) and not parts.scheme and not parts.netloc and not url.startswith(("#", "/"))


class SiteBuilder:
    """Renders pages and rewrites their local links; ``problems`` lists what did not resolve."""

    def __init__(self, root: Path, out: Path):
        self.root, self.out = root.resolve(), out.resolve()
        self.notebooks = sorted((self.root / "notebooks").glob("*.ipynb"))
        self.pending_md: list[Path] = []
        self.done_md: set[Path] = set()
        self.problems: list[str] = []

    # -- paths -----------------------------------------------------------------------------
    def page_of(self, source: Path) -> Path:
        """Where a source file lands in the site."""
        rel = source.relative_to(self.root)
        if source == self.root / "README.md":
            return self.out / "index.html"
        if source.suffix in (".ipynb", ".md"):
            return self.out / rel.with_suffix(".html")
        return self.out / rel

    def _rewrite(self, source: Path, page: Path, url: str) -> str:
        """The site URL for ``url`` written in ``source``; copies or queues what it needs."""
        if not _is_local(url):
            return url
        parts = urlsplit(url)
        target = (source.parent / unquote(parts.path)).resolve()
        if not target.is_relative_to(self.root) or not target.exists():
            self.problems.append(f"{source.relative_to(self.root)}: link to {url} "
                                 f"(no such file in the repository)")
            return url
        if target.is_dir():
            readme = target / "README.md"
            if not readme.exists():
                self.problems.append(f"{source.relative_to(self.root)}: link to folder {url}")
                return url
            target = readme
        if target.suffix == ".ipynb" and target not in self.notebooks:
            self.problems.append(f"{source.relative_to(self.root)}: link to {url} "
                                 f"(only notebooks/*.ipynb become pages)")
            return url
        if target.suffix == ".md" and target not in self.done_md:
            self.done_md.add(target)
            self.pending_md.append(target)
        elif target.suffix not in (".md", ".ipynb"):
            dest = self.page_of(target)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(target, dest)
        new = os.path.relpath(self.page_of(target), page.parent).replace(os.sep, "/")
        return new + (f"#{parts.fragment}" if parts.fragment else "")

    def _rewrite_links(self, source: Path, page: Path, text: str) -> str:
        return _LINK.sub(lambda m: m.group(1) + html.escape(
            self._rewrite(source, page, html.unescape(m.group(2))), quote=True) + m.group(3), text)

    # -- pages -----------------------------------------------------------------------------
    def _nav(self, page: Path, index: int) -> str:
        def link(target, text):
            return f'<a href="{os.path.relpath(target, page.parent)}">{html.escape(text)}</a>'
        items = [link(self.out / "index.html", "Course map")]
        if index > 0:
            items.append(link(self.page_of(self.notebooks[index - 1]),
                              "← " + self.notebooks[index - 1].stem))
        if index + 1 < len(self.notebooks):
            items.append(link(self.page_of(self.notebooks[index + 1]),
                              self.notebooks[index + 1].stem + " →"))
        return f'<nav class="lu-nav">{" ".join(items)}</nav>'

    @staticmethod
    def _static_panels(nb):
        """Widget outputs (knob panels) need a kernel: show a note instead."""
        nb = copy.deepcopy(nb)
        nb.metadata.pop("widgets", None)  # no widget-manager script fetched from a CDN
        for cell in nb.cells:
            for output in cell.get("outputs", []):
                data = output.get("data", {})
                if WIDGET_VIEW in data:
                    name = html.escape(data.get("text/plain", "widget"))
                    output["data"] = {"text/html": (
                        f'<div class="lu-static-panel">Interactive {name}: open this lab in '
                        f"JupyterLab (<code>make lab</code>) to use it.</div>"),
                        "text/plain": data.get("text/plain", "")}
        return nb

    def build_notebook(self, index: int):
        source = self.notebooks[index]
        page = self.page_of(source)
        nb = self._static_panels(nbformat.read(source, as_version=4))
        exporter = HTMLExporter(template_name="lab", embed_images=True)
        body, _ = exporter.from_notebook_node(
            nb, resources={"metadata": {"name": source.stem, "path": str(source.parent)}})
        body = self._rewrite_links(source, page, body)
        body = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + self._nav(page, index),
                      body, count=1)
        body = body.replace("</head>", f"<style>{_STYLE}</style></head>", 1)
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(body, encoding="utf-8")

    def build_markdown(self, source: Path):
        page = self.page_of(source)
        text = source.read_text(encoding="utf-8")
        render = mistune.create_markdown(escape=False, plugins=["table", "strikethrough", "url"])
        body = self._rewrite_links(source, page, render(text))
        title = next((line.lstrip("# ").strip() for line in text.splitlines()
                      if line.startswith("# ")), source.stem)
        nav = ("" if page == self.out / "index.html" else
               f'<nav class="lu-nav"><a href="{os.path.relpath(self.out / "index.html", page.parent)}">'
               f"Course map</a></nav>")
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(f'<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
                        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
                        f'<body class="lu-page">{nav}{body}</body></html>\n', encoding="utf-8")

    def build(self):
        if self.out.exists():
            shutil.rmtree(self.out)
        self.out.mkdir(parents=True)
        readme = self.root / "README.md"
        self.done_md.add(readme)
        self.pending_md.append(readme)
        for index in range(len(self.notebooks)):
            self.build_notebook(index)
        while self.pending_md:  # README, then the .md files pages link to
            self.build_markdown(self.pending_md.pop(0))
        return self.problems


def build_site(root=ROOT, out=None):
    """Build the site of ``root`` into ``out`` (default ``root/_site``); the unresolved links."""
    root = Path(root)
    return SiteBuilder(root, Path(out) if out else root / "_site").build()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "_site"), help="output folder (replaced)")
    parser.add_argument("--root", default=str(ROOT), help="repository root")
    args = parser.parse_args(argv)
    problems = build_site(args.root, args.out)
    pages = sorted(Path(args.out).rglob("*.html"))
    print(f"built {len(pages)} pages into {args.out}")
    for problem in problems:
        print(f"broken link: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
