"""The static course site (tools/build_site.py, `make site`): on a small made-up repository,
links are rewritten (notebook to page, .md rendered, files copied, anchors kept), stored outputs
are shown without re-execution and panels become a note, only the course map's labs get a page
and a place in the lab bar (in the map's order; a stray Untitled.ipynb gets neither), formulas
become MathML and no page loads anything from the internet; on the real repository, every lab
of the map has a page, no other notebook does, the site is offline and every local link and
anchor on every page resolves; both editions (the Chinese labs of notebooks/zh/ under zh/, a
Chinese index from README.md's 中文版 section) with a language switch that resolves both ways.
tests/test_site_browser.py looks at the pages in Chromium."""
import importlib.util
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest

pytestmark = [pytest.mark.lab01]
ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "build_site.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("build_site", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Links(HTMLParser):
    """The href/src values and the anchor targets (id, name) of one page."""

    def __init__(self):
        super().__init__()
        self.links, self.anchors = [], set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value is not None:
                self.links.append(value)
            if name in ("id", "name") and value:
                self.anchors.add(value)


def parse(page):
    links = Links()
    links.feed(page.read_text(encoding="utf-8"))
    return links


def lab_bar(page):
    """The (href, text) of each link in a lab page's bar (``<nav class="lu-nav">``)."""
    nav = re.search(r'<nav class="lu-nav">(.*?)</nav>', page.read_text(encoding="utf-8"), re.S)
    assert nav, f"{page.name} has no lab bar"
    return re.findall(r'<a href="([^"]*)">([^<]*)</a>', nav.group(1))


class Fetches(HTMLParser):
    """What a page makes the browser fetch from another host: <script src>, <link href> (style
    sheets, fonts, preloads), embedded media, and URLs in inline scripts (a dynamic import)."""
    SRC = {"script", "img", "iframe", "source", "audio", "video", "embed", "track"}

    def __init__(self):
        super().__init__()
        self.external, self._in_script = [], False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        url = attrs.get("href") if tag == "link" else attrs.get("src") if tag in self.SRC else None
        if url and re.match(r"\s*(https?:)?//", url):
            self.external.append(f"<{tag}> {url}")
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.external += [f"<script> {url}" for url in re.findall(r"https?://[^\s'\"`)]+", data)]


# CSS that fetches: url(...) and @import, in <style> or a style attribute, to another host.
CSS_FETCH = re.compile(r"""(?:url\(\s*['"]?|@import\s+['"])\s*((?:https?:)?//[^'")\s]+)""")


def internet_fetches(text):
    """Everything in one page's HTML that would be loaded from the internet."""
    fetches = Fetches()
    fetches.feed(text)
    return fetches.external + [f"css {url}" for url in CSS_FETCH.findall(text)]


def offline_problems(site):
    return [f"{page.relative_to(site)}: {fetch}" for page in sorted(site.rglob("*.html"))
            for fetch in internet_fetches(page.read_text(encoding="utf-8"))]


def broken_links(site):
    """Every local href/src (and #anchor) on every page of ``site`` that does not resolve."""
    pages = {page.resolve(): parse(page) for page in site.rglob("*.html")}
    broken = []
    for page, links in pages.items():
        for url in links.links:
            parts = urlsplit(url)
            if parts.scheme or parts.netloc or url.startswith("/"):
                continue  # external (CDN scripts, papers): not part of the site
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if not target.is_relative_to(site.resolve()) or not target.is_file():
                broken.append(f"{page.relative_to(site.resolve())}: {url}")
            elif parts.fragment and target.suffix == ".html" and \
                    not {parts.fragment, unquote(parts.fragment)} & pages[target].anchors:
                broken.append(f"{page.relative_to(site.resolve())}: {url} (no such anchor)")
    return broken


def switch(page):
    """The href of a page's language switch (``<a class="lu-lang">``), or None."""
    found = re.search(r'<a class="lu-lang" hreflang="[^"]*" href="([^"]*)">',
                      page.read_text(encoding="utf-8"))
    return found.group(1) if found else None


def code_cell(source, outputs):
    cell = nbformat.v4.new_code_cell(source, execution_count=1)
    cell.outputs = outputs
    return cell


def write_course_map(repo, *notebooks):
    """A labutils/course.py whose LABS lists ``notebooks`` (the real one has more fields)."""
    (repo / "labutils").mkdir(exist_ok=True)
    (repo / "labutils" / "course.py").write_text(
        "from dataclasses import dataclass\n\n\n@dataclass(frozen=True)\nclass Lab:\n"
        "    notebook: str\n\n\n"
        f"LABS = tuple(Lab(name) for name in {list(notebooks)!r})\n")


@pytest.fixture
def tiny_repo(tmp_path):
    """A repository with a course map of two labs (and one not written yet), two stray
    notebooks, a README, a guide, a source file, formulas and a broken link."""
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "docs").mkdir()
    (repo / "pkg").mkdir()
    write_course_map(repo, "01_a", "02_b", "03_coming")
    (repo / "pkg" / "ring.py").write_text("def ring():\n    pass\n")
    (repo / "docs" / "guide.md").write_text("# Guide\n\nBack to [the map](../README.md).\n")
    (repo / "README.md").write_text(
        "# Course\n\n| lab | notebook |\n|---|---|\n| 1 | [a](notebooks/01_a.ipynb) |\n"
        "| 2 | [b](notebooks/02_b.ipynb#Part-two) |\n\nSee the [guide](docs/guide.md).\n")
    a = nbformat.v4.new_notebook()
    a.cells = [
        nbformat.v4.new_markdown_cell("# Lab A\n\nNext: [lab B](02_b.ipynb#Part-two); "
                                      "the code: [ring](../pkg/ring.py); [gone](missing.ipynb)"),
        # Stored output differs from what the code would print: the site must not re-run it.
        code_cell("print(1 + 1)", [nbformat.v4.new_output("stream", name="stdout",
                                                           text="stored-output-42\n")]),
        nbformat.v4.new_markdown_cell(
            "The mean $\\bar{x} = \\frac{1}{n}\\sum_i x_i$, and with a line break\n"
            "$(f(x+\\varepsilon) - f(x-\\varepsilon)) /\n2\\varepsilon$; `$HOME` is code.\n\n"
            "$$\\sigma^2 = \\frac{1}{n}\\sum_i (x_i - \\bar{x})^2$$"),
        code_cell("display(Math(tex))", [nbformat.v4.new_output(
            "display_data", data={"text/plain": "<IPython.core.display.Math object>",
                                  "text/latex": "$\\displaystyle \\alpha_{out}$"})]),
        code_cell("panel", [nbformat.v4.new_output(
            "display_data", data={"text/plain": "Panel('Ring')",
                                  "application/vnd.jupyter.widget-view+json":
                                      {"model_id": "abc", "version_major": 2,
                                       "version_minor": 0}})]),
    ]
    b = nbformat.v4.new_notebook()
    b.cells = [nbformat.v4.new_markdown_cell("# Lab B\n\n## Part two\n\nBack to [A](01_a.ipynb).")]
    nbformat.write(a, repo / "notebooks" / "01_a.ipynb")
    nbformat.write(b, repo / "notebooks" / "02_b.ipynb")
    # Not in the map: what JupyterLab leaves behind (a new notebook, a copy of a lab).
    stray = nbformat.v4.new_notebook()
    stray.cells = [nbformat.v4.new_markdown_cell("# scratch\n\nstray-notebook-text")]
    nbformat.write(stray, repo / "notebooks" / "Untitled.ipynb")
    nbformat.write(stray, repo / "notebooks" / "01_a-Copy1.ipynb")
    return repo


def test_links_are_rewritten_and_outputs_are_the_stored_ones(tiny_repo, tmp_path):
    site = tmp_path / "site"
    problems = load_tool().build_site(tiny_repo, site)
    assert problems == ["notebooks/01_a.ipynb: link to missing.ipynb (no such file in the "
                        "repository)"]
    assert broken_links(site) == ["notebooks/01_a.html: missing.ipynb"]

    index = parse(site / "index.html")
    assert "notebooks/01_a.html" in index.links
    assert "notebooks/02_b.html#Part-two" in index.links
    assert "docs/guide.html" in index.links
    assert "<table>" in (site / "index.html").read_text()

    page_a = (site / "notebooks" / "01_a.html").read_text()
    links_a = parse(site / "notebooks" / "01_a.html").links
    assert "02_b.html#Part-two" in links_a and "../pkg/ring.py" in links_a
    assert (site / "pkg" / "ring.py").read_text() == (tiny_repo / "pkg" / "ring.py").read_text()
    assert "stored-output-42" in page_a
    assert "Interactive Panel('Ring'): open this lab in JupyterLab" in page_a
    assert "../index.html" in links_a and "02_b.html" in links_a  # the lab bar
    links_b = parse(site / "notebooks" / "02_b.html").links
    assert "01_a.html" in links_b and "../index.html" in links_b
    assert "../README.md" not in parse(site / "docs" / "guide.html").links
    assert "../index.html" in parse(site / "docs" / "guide.html").links


def test_only_the_course_maps_labs_get_pages_in_its_order(tiny_repo, tmp_path):
    site = tmp_path / "site"
    load_tool().build_site(tiny_repo, site)
    assert sorted(p.name for p in (site / "notebooks").glob("*")) == ["01_a.html", "02_b.html"]
    assert lab_bar(site / "notebooks" / "01_a.html") == [
        ("../index.html", "Course map"), ("02_b.html", "02_b →")]
    assert lab_bar(site / "notebooks" / "02_b.html") == [
        ("../index.html", "Course map"), ("01_a.html", "← 01_a")]
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert "Untitled" not in text and "Copy1" not in text and "stray-notebook" not in text

    # The bar follows the map, not the file names.
    write_course_map(tiny_repo, "02_b", "01_a")
    load_tool().build_site(tiny_repo, site)
    assert lab_bar(site / "notebooks" / "02_b.html") == [
        ("../index.html", "Course map"), ("01_a.html", "01_a →")]
    assert lab_bar(site / "notebooks" / "01_a.html") == [
        ("../index.html", "Course map"), ("02_b.html", "← 02_b")]


def test_a_link_to_a_stray_notebook_is_a_problem(tiny_repo, tmp_path):
    (tiny_repo / "docs" / "guide.md").write_text("# Guide\n\n[scratch](../notebooks/Untitled.ipynb)\n")
    problems = load_tool().build_site(tiny_repo, tmp_path / "site")
    assert "docs/guide.md: link to ../notebooks/Untitled.ipynb (only the course map's labs " \
           "become pages)" in problems


def test_formulas_are_mathml_and_nothing_is_loaded_from_the_internet(tiny_repo, tmp_path):
    site = tmp_path / "site"
    load_tool().build_site(tiny_repo, site)
    page_a = (site / "notebooks" / "01_a.html").read_text(encoding="utf-8")
    assert page_a.count("<math") == 4  # two inline, one display, one LaTeX output
    assert 'display="block"' in page_a
    for tex in ("\\frac", "\\bar", "\\varepsilon", "\\alpha", "$$"):
        assert tex not in page_a, f"TeX source {tex} left on the page"
    assert "<code>$HOME</code>" in page_a  # a dollar in code is no formula
    assert "mathjax" not in page_a.lower() and "require.js" not in page_a
    assert offline_problems(site) == []


def test_a_bad_formula_is_a_problem(tiny_repo, tmp_path):
    lab = nbformat.read(tiny_repo / "notebooks" / "02_b.ipynb", as_version=4)
    lab.cells.append(nbformat.v4.new_markdown_cell("Unknown: $\\notatexcommand x$"))
    nbformat.write(lab, tiny_repo / "notebooks" / "02_b.ipynb")
    problems = load_tool().build_site(tiny_repo, tmp_path / "site")
    assert any(p.startswith("notebooks/02_b.ipynb: formula $\\notatexcommand x$") for p in problems)


def test_the_offline_check_finds_what_a_cdn_page_loads():
    """The check itself: what nbconvert's default template and a web-font page would load is
    found; links in prose (papers) and the MathML namespace are not fetches."""
    page = """<html><head>
    <script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.1.10/require.min.js"></script>
    <link rel="stylesheet" href="//fonts.googleapis.com/css?family=Roboto">
    <style>@import "https://example.org/a.css"; @font-face { src: url('https://x.org/f.woff2') }
    </style><script type="module">const m = await import("https://cdn.example/m.mjs");</script>
    </head><body><a href="https://arxiv.org/abs/1909.08053">paper</a>
    <math xmlns="http://www.w3.org/1998/Math/MathML"><mi>x</mi></math>
    <div style="background: url(http://example.org/bg.png)"></div></body></html>"""
    assert sorted(internet_fetches(page)) == sorted([
        "<script> https://cdnjs.cloudflare.com/ajax/libs/require.js/2.1.10/require.min.js",
        "<link> //fonts.googleapis.com/css?family=Roboto",
        "<script> https://cdn.example/m.mjs",
        "css https://example.org/a.css", "css https://x.org/f.woff2",
        "css http://example.org/bg.png"])


def add_chinese_edition(repo):
    """A Chinese 01_a (02_b not translated) and README.md's Chinese section."""
    (repo / "notebooks" / "zh").mkdir()
    a = nbformat.v4.new_notebook()
    a.cells = [nbformat.v4.new_markdown_cell("# 实验 A\n\n代码：[ring](../../pkg/ring.py)"),
               code_cell("panel", [nbformat.v4.new_output(
                   "display_data", data={"text/plain": "Panel('Ring')",
                                         "application/vnd.jupyter.widget-view+json":
                                             {"model_id": "abc", "version_major": 2,
                                              "version_minor": 0}})])]
    nbformat.write(a, repo / "notebooks" / "zh" / "01_a.ipynb")
    readme = (repo / "README.md").read_text()
    (repo / "README.md").write_text(readme.replace(
        "\nSee the", "\n## 中文版\n\n中文说明：`make lab LANG=zh`，从 [01_a](notebooks/zh/01_a.ipynb) "
        "开始。\n\n## More\n\nSee the"))


def test_both_editions_with_a_language_switch_both_ways(tiny_repo, tmp_path):
    add_chinese_edition(tiny_repo)
    site = tmp_path / "site"
    problems = load_tool().build_site(tiny_repo, site)
    assert problems == ["notebooks/01_a.ipynb: link to missing.ipynb (no such file in the "
                        "repository)"]
    assert broken_links(site) == ["notebooks/01_a.html: missing.ipynb"]
    assert offline_problems(site) == []
    assert sorted(p.name for p in (site / "zh" / "notebooks").glob("*")) == ["01_a.html"]

    # Lab page <-> the same lab in the other edition; no switch where there is no translation.
    assert switch(site / "notebooks" / "01_a.html") == "../zh/notebooks/01_a.html"
    assert switch(site / "zh" / "notebooks" / "01_a.html") == "../../notebooks/01_a.html"
    assert switch(site / "notebooks" / "02_b.html") is None
    assert switch(site / "index.html") == "zh/index.html"
    assert switch(site / "zh" / "index.html") == "../index.html"

    zh_a = site / "zh" / "notebooks" / "01_a.html"
    assert lab_bar(zh_a) == [("../index.html", "课程地图")]  # the only Chinese lab
    text = zh_a.read_text(encoding="utf-8")
    assert '<html lang="zh-CN">' in text and "make lab LANG=zh" in text  # the panel's note
    assert "../../pkg/ring.py" in parse(zh_a).links

    index = (site / "zh" / "index.html").read_text(encoding="utf-8")
    assert "中文说明" in index and "See the" not in index  # README's section, not the rest
    assert "实验 A" in index  # the lab's Chinese title, in the course map's order
    assert "notebooks/01_a.html" in parse(site / "zh" / "index.html").links
    assert "zh/notebooks/01_a.html" in parse(site / "index.html").links


@pytest.mark.slow
def test_cli_fails_on_a_broken_link(tiny_repo, tmp_path):
    run = subprocess.run([sys.executable, str(TOOL), "--root", str(tiny_repo), "--out",
                          str(tmp_path / "site")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert "error: notebooks/01_a.ipynb: link to missing.ipynb" in run.stderr
    assert "built 4 pages" in run.stdout


@pytest.mark.slow
def test_course_site_has_every_lab_of_the_map_and_no_broken_link(tmp_path):
    from labutils import course
    labs = [lab.notebook for lab in course.LABS if lab.exists]
    assert labs, "no labs to build"
    site = tmp_path / "_site"
    run = subprocess.run([sys.executable, str(TOOL), "--out", str(site)], capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert sorted(p.stem for p in (site / "notebooks").glob("*.html")) == sorted(labs)
    for i, name in enumerate(labs):  # the bar's previous/next follow the map
        bar = [href for href, _ in lab_bar(site / "notebooks" / f"{name}.html")]
        assert bar == ["../index.html"] + [f"{n}.html" for n in labs[max(i - 1, 0):i + 2]
                                           if n != name]
    assert offline_problems(site) == []
    zh_labs = [name for name in labs if (ROOT / "notebooks" / "zh" / f"{name}.ipynb").exists()]
    assert zh_labs == labs, "every lab has its Chinese edition (make zh)"
    assert sorted(p.stem for p in (site / "zh" / "notebooks").glob("*.html")) == sorted(labs)
    for name in labs:  # the language switch, both ways
        assert switch(site / "notebooks" / f"{name}.html") == f"../zh/notebooks/{name}.html"
        assert switch(site / "zh" / "notebooks" / f"{name}.html") == f"../../notebooks/{name}.html"
    assert switch(site / "index.html") == "zh/index.html"
    assert switch(site / "zh" / "index.html") == "../index.html"
    lab02 = (site / "notebooks" / "02_pytorch_essentials.html").read_text(encoding="utf-8")
    assert "<math" in lab02 and "\\varepsilon" not in lab02
    assert (site / "index.html").is_file()
    index_links = parse(site / "index.html").links
    assert not [u for u in index_links if u.split("#")[0].endswith((".ipynb", ".md"))
                and not urlsplit(u).scheme], "README links were not rewritten"
    assert broken_links(site) == []
