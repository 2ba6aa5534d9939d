"""Formulas as MathML, made at build time (latex2mathml): the browser draws MathML itself, so
no page of the course site loads MathJax or any other script from the internet.

Two routes lead here. Notebook pages (mkdocs-jupyter renders them with nbconvert's Markdown
renderer) get ``use_mathml_in_notebooks()``: the renderer's math methods return MathML instead
of TeX left for MathJax. Markdown pages (landing, guide, handouts) go through
``pymdownx.arithmatex`` (generic mode: it finds the formulas, code spans and blocks excluded)
and ``arithmatex_to_mathml`` replaces its spans in the page's HTML.

A formula latex2mathml cannot convert is a problem (``PROBLEMS``), reported by the hook as a
warning, which fails the strict build: a teacher never finds raw TeX in front of a class.
"""
from __future__ import annotations

import html
import re

from latex2mathml.converter import convert as latex_to_mathml

PROBLEMS: list[str] = []  # drained by the hook after each page
_UNKNOWN_TEX = re.compile(r">(\\[A-Za-z]+)<")  # latex2mathml passes unknown commands through
_ARITHMATEX = re.compile(
    r'<(span|div) class="arithmatex">\s*(\\\(|\\\[)(.*?)(\\\)|\\\])\s*</\1>', re.S)


def tex_to_mathml(tex: str, display: str = "inline") -> str:
    """MathML for one formula; where latex2mathml cannot convert it, the TeX as code and a
    problem."""
    try:
        mathml = latex_to_mathml(tex.strip(), display=display)
    except Exception as error:  # latex2mathml raises plain exceptions of several kinds
        PROBLEMS.append(f"formula ${tex}$ cannot be converted to MathML ({error})")
        return f"<code>{html.escape(tex)}</code>"
    unknown = _UNKNOWN_TEX.search(mathml)
    if unknown:
        PROBLEMS.append(f"formula ${tex}$ uses {unknown.group(1)}, which latex2mathml does "
                        f"not know")
    return mathml


def latex_output_to_mathml(tex: str) -> str:
    """A ``text/latex`` output (``display(Math(...))``: ``$...$``, ``$$...$$``, ``\\(...\\)``
    or ``\\[...\\]``) as MathML."""
    tex = tex.strip()
    inline = tex.startswith(("$", "\\(")) and not tex.startswith("$$")
    tex = re.sub(r"^(\$\$|\$|\\\[|\\\()|(\$\$|\$|\\\]|\\\))$", "", tex)
    return tex_to_mathml(tex, "inline" if inline else "block")


def arithmatex_to_mathml(page_html: str) -> str:
    """Replace pymdownx.arithmatex's generic spans (``\\(...\\)``, ``\\[...\\]``) by MathML."""
    def convert(match):
        display = "inline" if match.group(2) == "\\(" else "block"
        return tex_to_mathml(html.unescape(match.group(3)), display)
    return _ARITHMATEX.sub(convert, page_html)


def use_mathml_in_notebooks():
    """Make nbconvert's Markdown renderer (used by mkdocs-jupyter) write MathML. mkdocs-jupyter
    patches the same class (its headings' ids) the same way."""
    from nbconvert.filters.markdown_mistune import IPythonRenderer

    IPythonRenderer.inline_math = lambda self, body: tex_to_mathml(body, "inline")
    IPythonRenderer.block_math = lambda self, body: tex_to_mathml(body, "block")
    IPythonRenderer.latex_environment = lambda self, name, body: tex_to_mathml(
        f"\\begin{{{name}}}{body}\\end{{{name}}}", "block")
