"""The course site's sources, staged into mkdocs' docs_dir (build/site-docs/, git-ignored) by
the hook (tools/site/hooks.py) before mkdocs reads it. Everything is generated from the
repository, nothing is executed:

* ``index.md`` / ``index.zh.md``: the student landing pages (tools/site/landing.py);
* ``notebooks/<lab>.ipynb`` / ``notebooks/<lab>.zh.ipynb``: the committed notebooks with their
  stored outputs, knob panels (widget outputs) replaced by a note, ``text/latex`` outputs given
  MathML;
* ``guide/<lab>.md`` / ``guide/<lab>.zh.md``: the teacher's guide (guide/<lab>.md, its Chinese
  guide/zh/<lab>.md) with its ``<!-- solutions -->`` marker replaced by the lab's reference
  solutions, read from labutils/exercises/;
* ``handouts/<lab>.md`` / ``handouts/<lab>.zh.md``: a printable handout per lab and edition: the
  first cell (central question, lesson plan, objectives), the key figures (the notebook's stored
  images) and the exercise cells.
"""
from __future__ import annotations

import base64
import importlib
import inspect
import os
import re
import shutil
from pathlib import Path

import nbformat

import mathml
from landing import landing, title_of

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- solutions -->"
SOLUTIONS = {"en": "## Exercise solutions", "zh": "## 练习参考答案"}
# the words the staged pages add, per edition
WORDS = {
    "en": {"handout": "Printable student handout: [handout for {lab}](../handouts/{lab}.md).",
           "no solution": "This lab has no exercise with a reference solution.",
           "title": "Handout: {title}", "figures": "Key figures", "exercises": "Exercises",
           "figure": "Figure {i}", "caption": "Figure {i} of {lab} (stored run)"},
    "zh": {"handout": "可打印的学生讲义：[{lab} 的讲义](../handouts/{lab}.md)。",
           "no solution": "本实验没有带参考答案的练习。",
           "title": "讲义：{title}", "figures": "关键图表", "exercises": "练习",
           "figure": "图 {i}", "caption": "{lab} 的图 {i}（存储的运行结果）"},
}
ALLOW_MISSING_GUIDE = "LU_SITE_ALLOW_MISSING_GUIDE"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PANEL_NOTE = {
    "en": "Knob panel {name}: open the lab in JupyterLab (<code>make lab</code>) to run this "
          "panel.",
    "zh": "控制面板 {name}：在 JupyterLab 中打开本实验（<code>make lab EDITION=zh</code>）即可运行"
          "此面板。",
}
EXERCISE = re.compile(r"(Exercise|练习)")  # a heading that opens an exercise section


class SiteError(Exception):
    """A source the site cannot be built from; the message names the file and the fix."""


def rel(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# -- notebooks -----------------------------------------------------------------------------
def static_notebook(source: Path, dest: Path, lang: str):
    """The committed notebook as the site shows it: stored outputs, no widget state (no
    widget-manager script from a CDN), panels as a note, LaTeX outputs with MathML."""
    nb = nbformat.read(source, as_version=4)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "text/latex" in data and "text/html" not in data:
                data["text/html"] = mathml.latex_output_to_mathml(data["text/latex"])
            if WIDGET_VIEW in data:
                name = data.get("text/plain", "").replace("<", "&lt;")
                output["data"] = {"text/html": f'<div class="lu-static-panel">'
                                               f'{PANEL_NOTE[lang].format(name=name)}</div>',
                                  "text/plain": data.get("text/plain", "")}
    if mathml.PROBLEMS:
        problems = "; ".join(mathml.PROBLEMS)
        mathml.PROBLEMS.clear()
        raise SiteError(f"{rel(source)}: a LaTeX output: {problems}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)


# -- teacher's guide -----------------------------------------------------------------------
def solution_source(name: str) -> str:
    """The reference solution of exercise ``name``, as lu.show_solution finds it."""
    from labutils import course
    module = importlib.import_module(course.checker_module(name))
    if not hasattr(module, name):
        raise SiteError(f"{module.__name__} has no reference solution {name!r} (course.LABS "
                        f"lists the exercise)")
    return inspect.getsource(getattr(module, name))


def guide_page(lab, path: Path, lang: str = "en") -> str:
    """guide/<lab>.md (``lang`` "zh": guide/zh/<lab>.md) with its marker replaced by every
    reference solution of the lab."""
    text = path.read_text(encoding="utf-8")
    lines = [line.strip() for line in text.splitlines()]
    heading = SOLUTIONS[lang]
    if lines.count(MARKER) != 1 or heading not in lines or \
            lines.index(heading) > lines.index(MARKER):
        raise SiteError(f"{rel(path)}: a guide page ends with a section '{heading}' holding "
                        f"the marker line '{MARKER}' once (the build puts the reference "
                        f"solutions there)")
    words = WORDS[lang]
    blocks = [f"### `{name}`\n\n```python\n{solution_source(name).rstrip()}\n```\n"
              for name in lab.checkers] or [words["no solution"] + "\n"]
    handout = "\n" + words["handout"].format(lab=lab.notebook) + "\n"
    return re.sub(rf"^[ \t]*{re.escape(MARKER)}[ \t]*$", lambda m: "\n".join(blocks), text,
                  flags=re.M) + handout


def guide_paths(labs, lang="en"):
    """Each lab's guide page (``lang`` "zh": guide/zh/); a missing one fails the build unless
    LU_SITE_ALLOW_MISSING_GUIDE=1 (while the guide is being written) leaves that lab out of
    the guide (the Chinese site then shows the English page)."""
    folder = ROOT / "guide" / ("zh" if lang == "zh" else "")
    paths, missing = {}, []
    for lab in labs:
        path = folder / f"{lab.notebook}.md"
        if path.exists():
            paths[lab.notebook] = path
        else:
            missing.append(rel(path.parent) + "/" + path.name)
    if missing and os.environ.get(ALLOW_MISSING_GUIDE) != "1":
        raise SiteError(f"no teacher's guide page {', '.join(missing)}: every lab of "
                        f"course.LABS has one (set {ALLOW_MISSING_GUIDE}=1 to build without)")
    return paths


def local_links(path: Path, text: str):
    """Repository files that a guide page links to (copied into the site as they are)."""
    for url in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text):
        if "://" in url or url.startswith(("mailto:", "/")):
            continue
        target = (path.parent / url).resolve()
        if target.is_file() and target.is_relative_to(ROOT) and \
                target.suffix not in (".md", ".ipynb"):
            yield target


# -- handouts ------------------------------------------------------------------------------
def exercise_sections(cells):
    """The notebook split into (level, kind, item) pieces, ``level`` the heading level of the
    exercise section the piece is in (None outside one): an exercise section runs from a heading
    'Exercise...' (or '练习...') to the next heading of its level or above."""
    pieces, level = [], None
    for cell in cells:
        if cell.cell_type != "markdown":
            pieces.append((level, cell.cell_type, cell))
            continue
        for segment in re.split(r"(?m)^(?=#{1,6} )", cell.source):
            heading = re.match(r"(#{1,6}) (.*)", segment)
            if heading and EXERCISE.match(heading.group(2)):
                level = len(heading.group(1))
            elif heading and level is not None and len(heading.group(1)) <= level:
                level = None
            if segment.strip():
                pieces.append((level, "markdown", segment))
    return pieces


def handout_page(lab, source: Path, figures_dir: Path, lang: str = "en") -> str:
    """Objectives and lesson plan (the first cell), key figures (the stored images outside the
    exercises), and the exercise sections (their text and code, never a show_solution cell)."""
    words = WORDS[lang]
    cells = nbformat.read(source, as_version=4).cells
    first = cells[0].source
    figures, exercises = [], []
    for level, kind, item in exercise_sections(cells[1:]):
        if kind == "markdown" and level:  # one level under the handout's own '## Exercises'
            item = re.sub(r"^#{1,6} (Exercises?|练习)\s*\n", "", item)  # that heading again
            exercises.append(re.sub(r"^(#{1,6}) ", lambda m: "#" * min(
                6, 3 + len(m.group(1)) - level) + " ", item))
        elif kind == "code" and level and "show_solution" not in item.source:
            exercises.append(f"```python\n{item.source.rstrip()}\n```")
        elif kind == "code" and not level:
            for output in item.get("outputs", []):
                png = output.get("data", {}).get("image/png")
                if png:
                    figures.append(f"fig{len(figures) + 1}.png")
                    figures_dir.mkdir(parents=True, exist_ok=True)
                    (figures_dir / figures[-1]).write_bytes(base64.b64decode(png))
    body = ["# " + words["title"].format(title=title_of(first, lab.notebook)),
            "\n".join(line for line in first.splitlines() if not line.startswith("# ")),
            "## " + words["figures"] if figures else ""]
    body += [f'<figure class="lu-figure" markdown>\n![{words["figure"].format(i=i)}]'
             f'({figures_dir.name}/{name})\n'
             f'<figcaption>{words["caption"].format(i=i, lab=lab.notebook)}</figcaption>\n'
             f'</figure>' for i, name in enumerate(figures, 1)]
    if exercises:  # the exercise sheet starts on a new page when printed
        body += ['<div class="lu-page-break"></div>', "## " + words["exercises"], *exercises]
    return "\n\n".join(part for part in body if part.strip()) + "\n"


# -- all of it -----------------------------------------------------------------------------
def stage(docs: Path, assets: Path):
    """Write the site's sources into ``docs`` (emptied first); returns the nav (course order)."""
    from labutils import course
    labs = [lab for lab in course.LABS if lab.exists]
    for lab in labs:
        if not (ROOT / "notebooks" / "zh" / f"{lab.notebook}.ipynb").exists():
            raise SiteError(f"notebooks/zh/{lab.notebook}.ipynb is missing: make zh builds the "
                            f"Chinese edition")
    guides = guide_paths(labs)
    guides_zh = guide_paths(labs, "zh")
    if docs.exists():
        shutil.rmtree(docs)
    docs.mkdir(parents=True)
    shutil.copytree(assets, docs / "assets")
    (docs / "index.md").write_text(landing(labs, "en"), encoding="utf-8")
    (docs / "index.zh.md").write_text(landing(labs, "zh"), encoding="utf-8")
    for lab in labs:
        name = lab.notebook
        static_notebook(ROOT / "notebooks" / f"{name}.ipynb",
                        docs / "notebooks" / f"{name}.ipynb", "en")
        static_notebook(ROOT / "notebooks" / "zh" / f"{name}.ipynb",
                        docs / "notebooks" / f"{name}.zh.ipynb", "zh")
        (docs / "handouts").mkdir(exist_ok=True)
        (docs / "handouts" / f"{name}.md").write_text(handout_page(
            lab, ROOT / "notebooks" / f"{name}.ipynb", docs / "handouts" / name),
            encoding="utf-8")
        (docs / "handouts" / f"{name}.zh.md").write_text(handout_page(
            lab, ROOT / "notebooks" / "zh" / f"{name}.ipynb", docs / "handouts" / f"{name}.zh",
            "zh"), encoding="utf-8")
        for lang, found, suffix in (("en", guides, ""), ("zh", guides_zh, ".zh")):
            if name not in found:
                continue
            text = guide_page(lab, found[name], lang)
            (docs / "guide").mkdir(exist_ok=True)
            (docs / "guide" / f"{name}{suffix}.md").write_text(text, encoding="utf-8")
            # links are written from guide/ in both editions (guide/zh/ keeps the targets)
            for target in local_links(ROOT / "guide" / f"{name}.md", text):
                (docs / rel(target)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(target, docs / rel(target))
    nav = [{"Home": "index.md"},
           {"Labs": [f"notebooks/{lab.notebook}.ipynb" for lab in labs]}]
    if guides:
        nav.append({"Teacher's guide": [f"guide/{lab.notebook}.md" for lab in labs
                                        if lab.notebook in guides]})
    nav.append({"Handouts": [f"handouts/{lab.notebook}.md" for lab in labs]})
    # JupyterHub and hosted services (docs/classrooms.md, checked by tests/test_classrooms.py)
    shutil.copyfile(ROOT / "docs" / "classrooms.md", docs / "classrooms.md")
    nav.append({"Other classrooms": "classrooms.md"})
    return nav
