"""The course site (`make site`: mkdocs-material, mkdocs-jupyter and mkdocs-static-i18n with
the hook tools/site/hooks.py). Without a build: the landing pages list every lab in course
order with its central question, the teacher's guide gets its solutions from
labutils/exercises/ (a page without the marker, or a lab without a page, fails the build with
the file's name), formulas become MathML, and the offline check finds what a CDN page loads.
On the site built once per session (tests/site_build.py, strict): every lab has an English and
a Chinese page, in course order in the sidebar of both editions; the search index holds a
lab's own words; nothing is loaded from the internet; formulas are MathML; every lab has a
guide page with its reference solutions and a printable handout; no page shows a machine path;
every local link resolves. tests/test_site_browser.py looks at the site in Chromium."""
import html
import importlib
import importlib.util
import inspect
import json
import re
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit

import nbformat
import pytest
from mkdocs.utils.yaml import yaml_load

from labutils import course

from .site_build import ROOT, course_site, load_site_module

pytestmark = [pytest.mark.lab01]
LABS = [lab for lab in course.LABS if lab.exists]


# -- what the build is made of (no process) ---------------------------------------------------
def first_cell(path):
    return nbformat.read(path, as_version=4).cells[0].source


def question(first):
    """The central question of a first cell, read here independently of tools/site/stage.py."""
    found = re.search(r"\*\*Central question\.\*\*\s*(.*?)(\n\n|$)", first, re.S)
    return " ".join(found.group(1).split()) if found else None


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_landing_page_lists_the_labs_in_order_with_their_questions(lang):
    page = load_site_module("landing").landing(LABS, lang)
    links = re.findall(r"\]\(notebooks/([^)]+)\.ipynb\)", page)
    assert links == [lab.notebook for lab in LABS]
    assert ("make lab" in page) and ("make lab EDITION=zh" in page) == (lang == "zh")
    for lab in LABS:
        english = first_cell(ROOT / "notebooks" / f"{lab.notebook}.ipynb")
        assert question(english), f"{lab.notebook} has no central question in its first cell"
        if lang == "en":
            assert question(english) in page
    assert "nbval" not in page and "| article chapter |" not in page  # not the developer README
    if lang == "zh":  # the Chinese titles, from the Chinese notebooks' first cells
        for lab in LABS:
            first = first_cell(ROOT / "notebooks" / "zh" / f"{lab.notebook}.ipynb")
            title = next(line[2:] for line in first.splitlines() if line.startswith("# "))
            assert f"[{title.strip()}](notebooks/{lab.notebook}.ipynb)" in page
        assert "怎样开始" in page


def lab_of(name):
    return next(lab for lab in course.LABS if lab.notebook == name)


def test_guide_page_gets_the_reference_solutions_from_the_exercise_modules(tmp_path):
    stage = load_site_module("stage")
    lab = lab_of("04a_ddp_from_scratch")
    guide = tmp_path / "04a_ddp_from_scratch.md"
    guide.write_text("# 04a guide\n\n## Exercise solutions\n\n<!-- solutions -->\n")
    page = stage.guide_page(lab, guide)
    assert "<!-- solutions -->" not in page
    assert len(lab.checkers) >= 2
    for name in lab.checkers:
        module = importlib.import_module(course.checker_module(name))
        assert f"### `{name}`\n\n```python\n{inspect.getsource(getattr(module, name))}" in page
    assert "../handouts/04a_ddp_from_scratch.md" in page


def test_a_guide_page_without_the_marker_fails_naming_the_file(tmp_path):
    stage = load_site_module("stage")
    guide = tmp_path / "01_introduction.md"
    guide.write_text("# guide\n\n## Exercise solutions\n\nSee the notebook.\n")
    with pytest.raises(stage.SiteError, match=r"01_introduction\.md.*<!-- solutions -->"):
        stage.guide_page(lab_of("01_introduction"), guide)
    guide.write_text("# guide\n\n<!-- solutions -->\n\n## Exercise solutions\n")  # above it
    with pytest.raises(stage.SiteError, match="## Exercise solutions"):
        stage.guide_page(lab_of("01_introduction"), guide)


def test_a_lab_without_a_guide_page_fails_unless_allowed(tmp_path, monkeypatch):
    stage = load_site_module("stage")
    monkeypatch.setattr(stage, "ROOT", tmp_path)
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "01_introduction.md").write_text("# guide\n")
    monkeypatch.delenv(stage.ALLOW_MISSING_GUIDE, raising=False)
    with pytest.raises(stage.SiteError, match=r"guide/02_pytorch_essentials\.md"):
        stage.guide_paths(LABS)
    monkeypatch.setenv(stage.ALLOW_MISSING_GUIDE, "1")
    assert list(stage.guide_paths(LABS)) == ["01_introduction"]


def test_formulas_become_mathml_and_a_bad_one_is_a_problem():
    mathml = load_site_module("mathml")
    mathml.PROBLEMS.clear()
    page = ('<p>The mean <span class="arithmatex">\\(\\bar{x} = \\frac{1}{n}\\sum_i x_i\\)'
            '</span>, and <code>$HOME</code>.</p>\n<div class="arithmatex">\\[\\sigma^2 &lt; '
            '1\\]</div>')
    out = mathml.arithmatex_to_mathml(page)
    assert out.count("<math") == 2 and 'display="block"' in out
    assert "<mo>&#x0003C;</mo>" in out  # the escaped < of the HTML is the formula's <
    assert "\\frac" not in out and "\\(" not in out and "<code>$HOME</code>" in out
    assert mathml.latex_output_to_mathml("$\\displaystyle \\alpha_{out}$").startswith("<math")
    assert mathml.PROBLEMS == []
    mathml.tex_to_mathml("\\notatexcommand x")
    assert mathml.PROBLEMS and "\\notatexcommand" in mathml.PROBLEMS[0]
    mathml.PROBLEMS.clear()


def test_staged_notebook_keeps_stored_outputs_panels_become_a_note(tmp_path):
    stage = load_site_module("stage")
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    panel = nbformat.v4.new_code_cell("panel", execution_count=1)
    panel.outputs = [nbformat.v4.new_output("display_data", data={
        "text/plain": "Panel('Ring')", "application/vnd.jupyter.widget-view+json":
            {"model_id": "abc", "version_major": 2, "version_minor": 0}})]
    formula = nbformat.v4.new_code_cell("display(Math(tex))", execution_count=2)
    formula.outputs = [nbformat.v4.new_output("display_data", data={
        "text/plain": "<Math>", "text/latex": "$\\displaystyle \\alpha_{out}$"})]
    printed = nbformat.v4.new_code_cell("print(1 + 1)", execution_count=3)
    printed.outputs = [nbformat.v4.new_output("stream", name="stdout", text="stored-42\n")]
    nb.cells = [panel, formula, printed]
    nbformat.write(nb, tmp_path / "lab.ipynb")
    for lang, words in (("en", "open the lab in JupyterLab"), ("zh", "make lab EDITION=zh")):
        stage.static_notebook(tmp_path / "lab.ipynb", tmp_path / lang / "lab.ipynb", lang)
        staged = nbformat.read(tmp_path / lang / "lab.ipynb", as_version=4)
        assert "widgets" not in staged.metadata  # no widget manager fetched from a CDN
        note = staged.cells[0].outputs[0]["data"]["text/html"]
        assert words in note and "Panel('Ring')" in note
        assert staged.cells[1].outputs[0]["data"]["text/html"].startswith("<math")
        assert staged.cells[2].outputs[0]["text"] == "stored-42\n"  # not run again


def test_mkdocs_config_is_strict_offline_and_bilingual():
    config = yaml_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["strict"] is True  # a broken link or a formula's problem fails the build
    assert config["validation"]["links"]["not_found"] == "warn"
    assert config["theme"]["font"] is False  # no Google Fonts
    plugins = [next(iter(p)) if isinstance(p, dict) else p for p in config["plugins"]]
    assert {"search", "offline", "mkdocs-jupyter", "i18n"} <= set(plugins)
    jupyter = next(p["mkdocs-jupyter"] for p in config["plugins"] if "mkdocs-jupyter" in p)
    assert jupyter["execute"] is False  # the committed outputs, never a new run
    assert not any("://" in url for url in config["extra"]["polyfills"])


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
            urls = re.findall(r"https?://[^\s'\"`)]+", data)
            self.external += [f"<script> {url}" for url in urls]


# CSS that fetches: url(...) and @import, in <style> or a style attribute, to another host.
CSS_FETCH = re.compile(r"""(?:url\(\s*['"]?|@import\s+['"])\s*((?:https?:)?//[^'")\s]+)""")


def internet_fetches(text):
    """Everything in one page's HTML that would be loaded from the internet."""
    fetches = Fetches()
    fetches.feed(text)
    return fetches.external + [f"css {url}" for url in CSS_FETCH.findall(text)]


def test_the_offline_check_finds_what_a_cdn_page_loads():
    """The check itself: what nbconvert's default template and a web-font page would load is
    found; links in prose (papers) and the MathML namespace are not fetches."""
    page = """<html><head>
    <script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.1.10/require.min.js"></script>
    <script src="https://unpkg.com/iframe-worker/shim"></script>
    <link rel="stylesheet" href="//fonts.googleapis.com/css?family=Roboto">
    <style>@import "https://example.org/a.css"; @font-face { src: url('https://x.org/f.woff2') }
    </style><script type="module">const m = await import("https://cdn.example/m.mjs");</script>
    </head><body><a href="https://arxiv.org/abs/1909.08053">paper</a>
    <math xmlns="http://www.w3.org/1998/Math/MathML"><mi>x</mi></math>
    <div style="background: url(http://example.org/bg.png)"></div></body></html>"""
    assert sorted(internet_fetches(page)) == sorted([
        "<script> https://cdnjs.cloudflare.com/ajax/libs/require.js/2.1.10/require.min.js",
        "<script> https://unpkg.com/iframe-worker/shim",
        "<link> //fonts.googleapis.com/css?family=Roboto",
        "<script> https://cdn.example/m.mjs",
        "css https://example.org/a.css", "css https://x.org/f.woff2",
        "css http://example.org/bg.png"])


# -- the built site (one build per session) ---------------------------------------------------
@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out, run = course_site(tmp_path_factory)
    assert run.returncode == 0, f"mkdocs build failed:\n{run.stderr[-6000:]}"
    assert not re.search(r"^(WARNING|ERROR)", run.stderr, re.M), run.stderr[-6000:]
    return out


def pages(site):
    return sorted(site.rglob("*.html"))


def sidebar_labs(page):
    """The lab pages the sidebar of ``page`` links to, in its order."""
    text = page.read_text(encoding="utf-8")
    primary = text[text.index('md-nav--primary'):text.index('md-sidebar--secondary')]
    names = {lab.notebook for lab in LABS}
    found = []
    for url in re.findall(r'href="([^"#]*)"', primary):
        folder, _, file = url.rpartition("/")
        # from a lab page the other labs are siblings; from elsewhere they are in notebooks/
        in_notebooks = folder.endswith("notebooks") or (not folder and "/notebooks/" in str(page))
        if in_notebooks and file.endswith(".html") and file[:-5] in names:
            found.append(file[:-5])
    return list(dict.fromkeys(found))


@pytest.mark.slow
def test_every_lab_has_an_english_and_a_chinese_page_in_course_order(site):
    names = [lab.notebook for lab in LABS]
    for name in names:
        en = (site / "notebooks" / f"{name}.html").read_text(encoding="utf-8")
        zh = (site / "zh" / "notebooks" / f"{name}.html").read_text(encoding="utf-8")
        assert 'lang="en"' in en[:300] and 'lang="zh"' in zh[:300]
        # the language switch leads to the same lab in the other edition
        assert f'href="../zh/notebooks/{name}.html" hreflang="zh"' in en
        assert f'href="../../notebooks/{name}.html" hreflang="en"' in zh
        title = first_cell(ROOT / "notebooks" / "zh" / f"{name}.ipynb")
        title = next(line[2:] for line in title.splitlines() if line.startswith("# "))
        assert html.escape(title.strip(), quote=False) in zh
    assert sidebar_labs(site / "index.html") == names
    assert sidebar_labs(site / "zh" / "index.html") == names
    assert sidebar_labs(site / "notebooks" / f"{names[-1]}.html") == names
    assert "panel" in (site / "notebooks" / "01_introduction.html").read_text(encoding="utf-8")


@pytest.mark.slow
def test_search_index_holds_a_labs_own_words(site):
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    hits = {doc["location"].split("#")[0] for doc in index["docs"] if "Hogwild" in doc["text"]}
    assert "notebooks/03b_sync_async_sgd.html" in hits
    assert (site / "search" / "search_index.js").is_file()  # the offline plugin's copy
    assert "zh" in index["config"]["lang"]


@pytest.mark.slow
def test_search_splits_chinese_text_into_words(site):
    """Chinese has no spaces: without a segmenter a whole sentence is one search token and
    「气泡」 finds nothing. jieba (requirements.txt) puts zero-width spaces between words and
    the separator in mkdocs.yml splits on them."""
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    separator = index["config"]["separator"]  # Python's re reads \u200b as JavaScript does
    assert re.split(separator, "流水线\u200b气泡") == ["流水线", "气泡"], separator
    hits = {doc["location"].split("#")[0] for doc in index["docs"]
            if "气泡" in re.split(separator, doc["text"])}
    assert "zh/notebooks/06a2_pipeline_schedules.html" in hits, sorted(hits)
    assert not any(h.startswith("notebooks/") for h in hits)  # the English pages say "bubble"


@pytest.mark.slow
def test_nothing_is_loaded_from_the_internet(site):
    problems = [f"{page.relative_to(site)}: {fetch}" for page in pages(site)
                for fetch in internet_fetches(page.read_text(encoding="utf-8"))]
    problems += [f"{css.relative_to(site)}: {url}" for css in site.rglob("*.css")
                 for url in CSS_FETCH.findall(css.read_text(encoding="utf-8"))]
    assert problems == []
    for page in pages(site):
        text = page.read_text(encoding="utf-8").lower()
        assert "mathjax" not in text and "require.js" not in text, page


@pytest.mark.slow
def test_formulas_are_mathml(site):
    lab02 = (site / "notebooks" / "02_pytorch_essentials.html").read_text(encoding="utf-8")
    assert "<math" in lab02
    prose = re.sub(r'<div class="highlight-ipynb.*?</div>', "", lab02, flags=re.S)
    assert "\\varepsilon" not in prose and "$$" not in prose
    assert sum(page.read_text(encoding="utf-8").count("<math") for page in pages(site)) > 50


@pytest.mark.slow
def test_guide_has_a_page_per_lab_with_the_reference_solutions(site):
    for lab in LABS:
        page = site / "guide" / f"{lab.notebook}.html"
        assert page.is_file(), f"no teacher's guide page for {lab.notebook}"
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))
        for name in lab.checkers:
            module = importlib.import_module(course.checker_module(name))
            assert inspect.getsource(getattr(module, name)).rstrip() in text, (lab, name)
        assert "<!-- solutions -->" not in page.read_text(encoding="utf-8")
        assert f"../handouts/{lab.notebook}.html" in page.read_text(encoding="utf-8")
    index = (site / "index.html").read_text(encoding="utf-8")
    assert "Teacher&#39;s guide" in index or "Teacher's guide" in index


@pytest.mark.slow
def test_the_chinese_site_has_the_chinese_guide_and_handouts(site):
    """guide/zh/<lab>.md becomes the Chinese guide page, with the same reference solutions;
    the Chinese handout is made from the Chinese notebook."""
    for lab in LABS:
        guide = (site / "zh" / "guide" / f"{lab.notebook}.html").read_text(encoding="utf-8")
        text = html.unescape(re.sub(r"<[^>]+>", "", guide))
        assert "练习参考答案" in text and "教学安排" in text, lab.notebook
        for name in lab.checkers:
            module = importlib.import_module(course.checker_module(name))
            assert inspect.getsource(getattr(module, name)).rstrip() in text, (lab, name)
        assert f"../handouts/{lab.notebook}.html" in guide
        handout = (site / "zh" / "handouts" / f"{lab.notebook}.html").read_text(
            encoding="utf-8")
        title = first_cell(ROOT / "notebooks" / "zh" / f"{lab.notebook}.ipynb")
        title = next(line[2:] for line in title.splitlines() if line.startswith("# "))
        assert html.escape(f"讲义：{title.strip()}", quote=False) in handout, lab.notebook
        for src in re.findall(r'<img[^>]*src="([^"]+)"', handout):  # the figures are there
            assert (site / "zh" / "handouts" / src).resolve().is_file(), (lab.notebook, src)


@pytest.mark.slow
def test_every_lab_has_a_printable_handout(site):
    css = (site / "assets" / "site.css").read_text(encoding="utf-8")
    assert "@media print" in css and ".md-sidebar" in css
    for lab in LABS:
        page = (site / "handouts" / f"{lab.notebook}.html").read_text(encoding="utf-8")
        assert "assets/site.css" in page
        english = first_cell(ROOT / "notebooks" / f"{lab.notebook}.ipynb")
        assert html.escape(question(english).split(",")[0], quote=False) in \
            " ".join(page.split())
        cells = nbformat.read(ROOT / "notebooks" / f"{lab.notebook}.ipynb", as_version=4).cells
        headings = [line.lstrip("#").strip() for cell in cells if cell.cell_type == "markdown"
                    for line in cell.source.splitlines()
                    if re.match(r"#{2,6} Exercise", line)]
        for heading in headings:  # every exercise, on the exercise sheet after a page break
            assert 'id="exercises"' in page and "lu-page-break" in page
            if heading not in ("Exercise", "Exercises"):
                assert html.escape(heading, quote=False) in page, (lab.notebook, heading)
        assert "show_solution" not in page


@pytest.mark.slow
def test_no_page_shows_a_machine_path(site):
    path = re.compile(r"/(?:tmp|home|Users|root|work|private/var)/\w|site-packages|[A-Z]:\\\\")
    found = [f"{page.relative_to(site)}: {m.group(0)}" for page in pages(site)
             for m in path.finditer(page.read_text(encoding="utf-8"))]
    assert found == []


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


@pytest.mark.slow
def test_every_local_link_resolves(site):
    parsed = {}
    for page in pages(site):
        parsed[page.resolve()] = Links()
        parsed[page.resolve()].feed(page.read_text(encoding="utf-8"))
    broken = []
    for page, links in parsed.items():
        for url in links.links:
            parts = urlsplit(url)
            if parts.scheme or parts.netloc or url.startswith("/"):
                continue
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if not target.is_relative_to(site.resolve()) or not target.exists():
                broken.append(f"{page.relative_to(site.resolve())}: {url}")
            elif parts.fragment and target.suffix == ".html" and \
                    not {parts.fragment, unquote(parts.fragment)} & parsed[target].anchors:
                broken.append(f"{page.relative_to(site.resolve())}: {url} (no such anchor)")
    assert broken == []


# ---- the teacher's guide quotes the committed runs (tools/guide_quotes.py) --------------------

def _quotes_tool():
    spec = importlib.util.spec_from_file_location("guide_quotes",
                                                  ROOT / "tools" / "guide_quotes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_guide_quotes_what_each_committed_run_printed():
    """Every decimal a guide page quotes from "the committed run" is in that notebook's stored
    outputs (the Chinese page: the Chinese notebook's): re-executing a lab without refreshing
    its guide fails here."""
    tool = _quotes_tool()
    checked = list(tool.pages())
    assert len(checked) == 2 * len(LABS)
    stale = {f"{lang} {page.stem}": tool.stale_quotes(page, notebook, lang)
             for lang, page, notebook in checked}
    stale = {k: v for k, v in stale.items() if v}
    assert not stale, f"quotes the stored outputs do not print: {stale}"


def test_the_quote_check_finds_a_stale_figure_and_passes_a_named_parameter(tmp_path):
    tool = _quotes_tool()
    nb = {"cells": [{"cell_type": "code", "source": "x = 0.25",
                     "outputs": [{"output_type": "stream",
                                  "text": "speedup 1.22x (1.07-1.47), moved 3.9e-03"}]}]}
    notebook = tmp_path / "lab.ipynb"
    notebook.write_text(json.dumps(nb), encoding="utf-8")
    page = tmp_path / "lab.md"
    page.write_text("- The committed run printed 1.22x (95% CI 1.07-1.48), margin 0.25,\n"
                    "  moved 3.9e-3, then 1.21x.\n"
                    "- Elsewhere 9.99.\n", encoding="utf-8")
    assert tool.stale_quotes(page, notebook, "en") == ["1.48", "1.21"]
    page.write_text("- 已提交的运行打印出 1.23 倍。 <!-- not from the run: 1.23 -->\n",
                    encoding="utf-8")
    assert tool.stale_quotes(page, notebook, "zh") == []
