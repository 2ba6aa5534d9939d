"""The course site's mkdocs hook (mkdocs.yml ``hooks:``), run by `make site`.

* on_config: stages the sources (tools/site/stage.py: landing pages, notebooks, teacher's guide
  with its solutions, handouts) into docs_dir and sets the nav in course order; once per
  process (mkdocs-static-i18n builds each edition with the same config, calling it again).
* Formulas become MathML (tools/site/mathml.py): in notebook pages through nbconvert's
  renderer, in Markdown pages from pymdownx.arithmatex's spans.
* Notebook pages lose the scripts nbconvert's template would load from a CDN (MathJax,
  mermaid); any local link on them that is no page of the site is a warning.
A formula that cannot be converted or a broken link is a warning, which fails the strict build.
"""
from __future__ import annotations

import logging
import posixpath
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File
from mkdocs.structure.toc import get_toc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mathml  # noqa: E402  (tools/site/ is no package)
import stage  # noqa: E402

log = logging.getLogger("mkdocs.hooks.course_site")
mathml.use_mathml_in_notebooks()
# A notebook is a page. mkdocs-jupyter wraps each .ipynb in a File that says so, but
# mkdocs-static-i18n makes plain Files again (to give each edition its pages), which would copy
# the notebook as it is; so every File of a notebook says it.
_is_page = File.is_documentation_page
File.is_documentation_page = lambda self: self.src_uri.endswith(".ipynb") or _is_page(self)
_STAGED: dict[str, list] = {}  # docs_dir -> nav, staged once per process
# nbconvert's template scripts that fetch from a CDN: MathJax (formulas are MathML already) and
# mermaid (no lab draws a diagram).
_SCRIPT = re.compile(r"<script\b([^>]*)>(.*?)</script>", re.S)
_MATHJAX_COMMENTS = re.compile(r"<!-- (Load mathjax|MathJax configuration|End of mathjax "
                               r"configuration) -->")
_HEADING = re.compile(r'<h([1-6])\b[^>]*\sid="([^"]+)"[^>]*>(.*?)</h\1>', re.S)
_HREF = re.compile(r'\s(?:href|src)="([^"]*)"')


@event_priority(100)  # before mkdocs-static-i18n (-100) reads the nav
def on_config(config):
    docs = str(Path(config.docs_dir).resolve())
    if docs not in _STAGED:
        try:
            _STAGED[docs] = stage.stage(Path(docs), Path(__file__).resolve().parent / "assets")
        except stage.SiteError as error:
            raise PluginError(str(error)) from error
    config.nav = _STAGED[docs]
    return config


def _cdn_script(match) -> str:
    attrs, body = match.group(1), match.group(2)
    src = re.search(r'src="([^"]*)"', attrs)
    if (src and not _local(src.group(1))) or "mathjax" in attrs.lower() \
            or "mermaid" in body or "MathJax" in body:
        return ""
    return match.group(0)


def _local(url: str) -> bool:
    return bool(url) and "://" not in url and not url.startswith(("//", "data:", "#", "mailto:"))


def _checked_link(match, where: str, files) -> str:
    """A link of a notebook page: another lab's .ipynb becomes its page (.html); a local link
    to nothing in the site is a warning."""
    url = match.group(1)
    path, _, anchor = url.partition("#")
    if not _local(url) or not path:
        return match.group(0)
    target = files.get_file_from_path(posixpath.normpath(posixpath.join(posixpath.dirname(where),
                                                                    path)))
    if target is None:
        log.warning(f"{where}: link to {url}, which is no page or file of the site")
    elif path.endswith(".ipynb"):
        return match.group(0).replace(url, path[:-len(".ipynb")] + ".html"
                                      + (f"#{anchor}" if anchor else ""))
    return match.group(0)


def _toc(page_html: str):
    """The table of contents of a notebook page, from the ids its headings have. (mkdocs-jupyter
    makes it from a Markdown copy without code spans, whose anchors miss the headings that
    hold code, e.g. '3. `nn.Module`, data and an optimiser'.)"""
    root = {"level": 0, "children": []}
    stack = [root]
    for level, anchor, inner in _HEADING.findall(page_html):
        name = re.sub(r"<[^>]+>", "", inner).replace("¶", "").strip()
        token = {"level": int(level), "id": anchor, "name": name, "children": []}
        while stack[-1]["level"] >= token["level"]:
            stack.pop()
        stack[-1]["children"].append(token)
        stack.append(token)
    return get_toc(root["children"])


def on_page_content(html, page, config, files):
    where = page.file.src_uri
    if where.endswith(".ipynb"):
        html = _MATHJAX_COMMENTS.sub("", _SCRIPT.sub(_cdn_script, html))
        page.toc = _toc(html)
        html = _HREF.sub(lambda match: _checked_link(match, where, files), html)
    else:
        html = mathml.arithmatex_to_mathml(html)
    for problem in mathml.PROBLEMS:
        log.warning(f"{where}: {problem}")
    mathml.PROBLEMS.clear()
    return html
