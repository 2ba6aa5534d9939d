"""Build the static course site: every lab of the course map (``labutils/course.py``'s
``LABS``) with its stored outputs (no re-execution) as an HTML page, README.md as the index,
links between pages rewritten to the HTML pages.

    python tools/build_site.py [--out _site]        # or: make site

Layout mirrors the repository: ``notebooks/NN_name.ipynb`` becomes ``notebooks/NN_name.html``,
``README.md`` becomes ``index.html``, another linked ``.md`` becomes ``.html``, and any other
local file a page links to (an image, a ``labutils`` source file) is copied. Each lab page gets
a bar with links to the course map and to the previous and next lab. Only the map's labs get a
page, in the map's order: a stray ``Untitled.ipynb`` gets neither a page nor a place in a bar.
Knob panels cannot run in a static page: their output becomes a note saying to open the lab in
JupyterLab.

Both editions: the Chinese labs (``notebooks/zh/NN_name.ipynb``, built by tools/zh_catalog.py)
become ``zh/notebooks/NN_name.html``, with a Chinese bar, and ``zh/index.html`` is made from
README.md's Chinese section (``## 中文版``) and the course map (each lab's Chinese title). Every
lab page and both indexes carry a language switch (``<a class="lu-lang">``) to the same page in
the other edition, where it exists.

The site works offline (a classroom without Wi-Fi): formulas are turned into MathML here, which
the browser draws itself, so no page loads MathJax, require.js or anything else from the
internet. Tested by ``tests/test_site.py`` (pages, links, offline) and
``tests/test_site_browser.py`` (formulas and Chinese titles drawn in Chromium).
"""
from __future__ import annotations

import argparse
import copy
import html
import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import mistune
import nbformat
from jinja2 import DictLoader, pass_context
from latex2mathml.converter import convert as latex_to_mathml
from nbconvert import HTMLExporter
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

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
.lu-lang { margin-left: auto; }
.lu-static-panel { border: 1px dashed #99a; padding: 0.4rem 0.8rem; color: #445; }
math[display="block"] { margin: 0.6rem 0; }
"""
# nbconvert's lab template, less what it would fetch from a CDN: require.js (nothing on a static
# page uses it), MathJax (formulas are MathML already) and mermaid (no lab draws a diagram; one
# would show as its source).
_TEMPLATE = """{%- extends "index.html.j2" -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""
_UNKNOWN_TEX = re.compile(r">(\\[A-Za-z]+)<")  # latex2mathml passes unknown commands through
ZH_SECTION = "## 中文版"
# The words of the page furniture, per edition.
_WORDS = {
    "en": {"map": "Course map", "switch": "中文", "switch_lang": "zh-CN",
           "panel": "Interactive {name}: open this lab in JupyterLab (<code>make lab</code>) to "
                    "use it."},
    "zh": {"map": "课程地图", "switch": "English", "switch_lang": "en",
           "panel": "交互式 {name}：在 JupyterLab 中打开本实验（<code>make lab LANG=zh</code>）"
                    "即可使用。"},
}


def course_labs(root: Path):
    """The notebook names of ``root``'s course map, in its order (loaded from the file, so
    ``--root`` builds that repository's map, not the one this script was imported with)."""
    spec = importlib.util.spec_from_file_location("_site_course", root / "labutils" / "course.py")
    course = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = course  # dataclasses look their module up while it is executed
    try:
        spec.loader.exec_module(course)
    finally:
        del sys.modules[spec.name]
    return [lab.notebook for lab in course.LABS]


def tex_to_mathml(tex: str, display: str, where: str, problems: list) -> str:
    """MathML for one formula; where latex2mathml cannot convert it, the TeX as code and a
    problem (the build then fails, rather than a teacher finding raw TeX in front of a class)."""
    try:
        mathml = latex_to_mathml(tex.strip(), display=display)
    except Exception as error:  # latex2mathml raises plain exceptions of several kinds
        problems.append(f"{where}: formula ${tex}$ cannot be converted to MathML ({error})")
        return f"<code>{html.escape(tex)}</code>"
    unknown = _UNKNOWN_TEX.search(mathml)
    if unknown:
        problems.append(f"{where}: formula ${tex}$ uses {unknown.group(1)}, which latex2mathml "
                        f"does not know")
    return mathml


class _MathMLRenderer(IPythonRenderer):
    """nbconvert's Markdown renderer with formulas as MathML instead of TeX left for MathJax."""

    def __init__(self, where, problems, **kwargs):
        super().__init__(**kwargs)
        self.where, self.problems = where, problems

    def inline_math(self, body):
        return tex_to_mathml(body, "inline", self.where, self.problems)

    def block_math(self, body):
        return tex_to_mathml(body, "block", self.where, self.problems)

    def latex_environment(self, name, body):
        return tex_to_mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", "block", self.where,
                             self.problems)


class _OfflineExporter(HTMLExporter):
    """The lab template without CDN scripts, Markdown rendered by ``_MathMLRenderer``."""

    def __init__(self, where, problems):
        super().__init__(template_name="lab", embed_images=True, template_file="site.html.j2",
                         extra_loaders=[DictLoader({"site.html.j2": _TEMPLATE})])
        self.where, self.problems = where, problems

    @pass_context  # a Jinja filter that reads the cell (attachments) from the template context
    def markdown2html(self, context, source):
        # As HTMLExporter.markdown2html (attachments, images, anchors), with the MathML renderer.
        cell = context.get("cell", {})
        path = context.get("resources", {}).get("metadata", {}).get("path", "")
        renderer = _MathMLRenderer(
            self.where, self.problems, escape=False, attachments=cell.get("attachments", {}),
            embed_images=self.embed_images, path=path, anchor_link_text=self.anchor_link_text,
            exclude_anchor_links=self.exclude_anchor_links, **self.lexer_options)
        return MarkdownWithMath(renderer=renderer).render(source)


def _is_local(url):
    parts = urlsplit(url)
    return bool(url) and not parts.scheme and not parts.netloc and not url.startswith(("#", "/"))


class SiteBuilder:
    """Renders pages and rewrites their local links; ``problems`` lists what did not resolve."""

    def __init__(self, root: Path, out: Path):
        self.root, self.out = root.resolve(), out.resolve()
        # The map's labs that are written, in its order; anything else in notebooks/ (an
        # Untitled.ipynb, a scratch copy) is no lab: no page, no place in the previous/next bar.
        names = course_labs(self.root)
        self.notebooks = [path for path in (self.root / "notebooks" / f"{name}.ipynb"
                                            for name in names) if path.exists()]
        # The Chinese edition: the map's labs that notebooks/zh/ holds, in the map's order.
        self.zh_notebooks = [path for path in (self.root / "notebooks" / "zh" / f"{name}.ipynb"
                                               for name in names) if path.exists()]
        self.pending_md: list[Path] = []
        self.done_md: set[Path] = set()
        self.problems: list[str] = []

    # -- paths -----------------------------------------------------------------------------
    def page_of(self, source: Path) -> Path:
        """Where a source file lands in the site."""
        rel = source.relative_to(self.root)
        if source == self.root / "README.md":
            return self.out / "index.html"
        if source in self.zh_notebooks:
            return self.out / "zh" / "notebooks" / f"{source.stem}.html"
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
        if target.suffix == ".ipynb" and target not in self.notebooks + self.zh_notebooks:
            self.problems.append(f"{source.relative_to(self.root)}: link to {url} "
                                 f"(only the course map's labs become pages)")
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
    def index_of(self, lang: str) -> Path:
        return self.out / "index.html" if lang == "en" else self.out / "zh" / "index.html"

    def counterpart(self, source: Path) -> Path | None:
        """The page of the same lab (or index) in the other edition, where it exists."""
        if source == self.root / "README.md":
            return self.index_of("zh") if self.zh_notebooks else None
        if source == self.index_of("zh"):
            return self.index_of("en")
        if source in self.zh_notebooks:
            return next((self.page_of(en) for en in self.notebooks if en.name == source.name), None)
        return next((self.page_of(zh) for zh in self.zh_notebooks if zh.name == source.name), None)

    def _switch(self, page: Path, source: Path, lang: str) -> str:
        """The language switch link, or nothing where the other edition has no such page."""
        other = self.counterpart(source)
        if other is None:
            return ""
        words = _WORDS[lang]
        return (f'<a class="lu-lang" hreflang="{words["switch_lang"]}" '
                f'href="{os.path.relpath(other, page.parent)}">{words["switch"]}</a>')

    def _nav(self, page: Path, index: int, lang: str = "en") -> str:
        labs = self.notebooks if lang == "en" else self.zh_notebooks

        def link(target, text):
            return f'<a href="{os.path.relpath(target, page.parent)}">{html.escape(text)}</a>'
        items = [link(self.index_of(lang), _WORDS[lang]["map"])]
        if index > 0:
            items.append(link(self.page_of(labs[index - 1]), "← " + labs[index - 1].stem))
        if index + 1 < len(labs):
            items.append(link(self.page_of(labs[index + 1]), labs[index + 1].stem + " →"))
        items.append(self._switch(page, labs[index], lang))
        return f'<nav class="lu-nav">{" ".join(item for item in items if item)}</nav>'

    def _static_panels(self, nb, where, lang="en"):
        """Widget outputs (knob panels) need a kernel: show a note instead. A LaTeX output
        (``display(Math(...))``) gets its MathML as HTML, which the template prefers."""
        nb = copy.deepcopy(nb)
        nb.metadata.pop("widgets", None)  # no widget-manager script fetched from a CDN
        for cell in nb.cells:
            for output in cell.get("outputs", []):
                data = output.get("data", {})
                if "text/latex" in data and "text/html" not in data:
                    tex = data["text/latex"].strip()
                    inline = tex.startswith(("$", "\\(")) and not tex.startswith("$$")
                    tex = re.sub(r"^(\$\$|\$|\\\[|\\\()|(\$\$|\$|\\\]|\\\))$", "", tex)
                    data["text/html"] = tex_to_mathml(tex, "inline" if inline else "block",
                                                      where, self.problems)
                if WIDGET_VIEW in data:
                    name = html.escape(data.get("text/plain", "widget"))
                    output["data"] = {"text/html": (
                        f'<div class="lu-static-panel">'
                        f'{_WORDS[lang]["panel"].format(name=name)}</div>'),
                        "text/plain": data.get("text/plain", "")}
        return nb

    def build_notebook(self, index: int, lang: str = "en"):
        source = (self.notebooks if lang == "en" else self.zh_notebooks)[index]
        page = self.page_of(source)
        where = str(source.relative_to(self.root))
        nb = self._static_panels(nbformat.read(source, as_version=4), where, lang)
        exporter = _OfflineExporter(where, self.problems)
        body, _ = exporter.from_notebook_node(
            nb, resources={"metadata": {"name": source.stem, "path": str(source.parent)}})
        body = self._rewrite_links(source, page, body)
        body = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + self._nav(page, index, lang),
                      body, count=1)
        if lang == "zh":  # the browser picks Chinese fonts and line breaking by the page's lang
            body = re.sub(r"<html[^>]*>", '<html lang="zh-CN">', body, count=1)
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
        nav = (f'<nav class="lu-nav">{self._switch(page, source, "en")}</nav>'
               if page == self.out / "index.html" else
               f'<nav class="lu-nav"><a href="{os.path.relpath(self.out / "index.html", page.parent)}">'
               f"Course map</a></nav>")
        self._write_page(page, title, nav, body, "en")

    def _write_page(self, page: Path, title: str, nav: str, body: str, lang: str):
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(f'<!DOCTYPE html>\n<html lang="{"en" if lang == "en" else "zh-CN"}">'
                        f'<head><meta charset="utf-8">'
                        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
                        f'<body class="lu-page">{nav}{body}</body></html>\n', encoding="utf-8")

    def zh_index_markdown(self) -> str:
        """README.md's Chinese section, then the course map's Chinese labs with their titles
        (each Chinese notebook's first heading), links written from the repository root."""
        text = (self.root / "README.md").read_text(encoding="utf-8")
        lines, section = text.splitlines(), []
        if ZH_SECTION in lines:
            start = lines.index(ZH_SECTION)
            end = next((i for i in range(start + 1, len(lines))
                        if lines[i].startswith("## ")), len(lines))
            section = lines[start + 1:end]
        else:
            self.problems.append(f"README.md: no '{ZH_SECTION}' section for the Chinese index")
        rows = ["| 实验 | 标题 |", "|---|---|"]
        for path in self.zh_notebooks:
            cells = nbformat.read(path, as_version=4).cells
            first = cells[0].source if cells else ""
            title = next((ln.lstrip("# ").strip() for ln in first.splitlines()
                          if ln.startswith("# ")), path.stem)
            rows.append(f"| [{path.stem}](notebooks/zh/{path.name}) | "
                        f"{title.replace('|', '&#124;')} |")
        return "\n".join(["# PyTorch 分布式训练与模型并行化实践（中文版）", "", *section, "",
                          "## 实验（课程地图）", "", *rows, ""])

    def build_zh_index(self):
        page = self.index_of("zh")
        render = mistune.create_markdown(escape=False, plugins=["table", "strikethrough", "url"])
        # Links are written from the repository root, as in README.md.
        body = self._rewrite_links(self.root / "README.md", page, render(self.zh_index_markdown()))
        nav = f'<nav class="lu-nav">{self._switch(page, page, "zh")}</nav>'
        self._write_page(page, "PyTorch 分布式训练与模型并行化实践（中文版）", nav, body, "zh")

    def build(self):
        if self.out.exists():
            shutil.rmtree(self.out)
        self.out.mkdir(parents=True)
        readme = self.root / "README.md"
        self.done_md.add(readme)
        self.pending_md.append(readme)
        for index in range(len(self.notebooks)):
            self.build_notebook(index)
        for index in range(len(self.zh_notebooks)):
            self.build_notebook(index, "zh")
        if self.zh_notebooks:
            self.build_zh_index()
        while self.pending_md:  # README, then the .md files pages link to
            self.build_markdown(self.pending_md.pop(0))
        return self.problems


def build_site(root=ROOT, out=None):
    """Build the site of ``root`` into ``out`` (default ``root/_site``); what went wrong (links
    that do not resolve, formulas that cannot be converted)."""
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
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
