"""The static course site (tools/build_site.py, `make site`): on a small made-up repository,
links are rewritten (notebook to page, .md rendered, files copied, anchors kept), stored outputs
are shown without re-execution and panels become a note; on the real repository, every
notebook has a page and every local link and anchor on every page resolves."""
import importlib.util
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


def code_cell(source, outputs):
    cell = nbformat.v4.new_code_cell(source, execution_count=1)
    cell.outputs = outputs
    return cell


@pytest.fixture
def tiny_repo(tmp_path):
    """A repository with two notebooks, a README, a guide, a source file and a broken link."""
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "docs").mkdir()
    (repo / "pkg").mkdir()
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


@pytest.mark.slow
def test_cli_fails_on_a_broken_link(tiny_repo, tmp_path):
    run = subprocess.run([sys.executable, str(TOOL), "--root", str(tiny_repo), "--out",
                          str(tmp_path / "site")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert "broken link: notebooks/01_a.ipynb: link to missing.ipynb" in run.stderr
    assert "built 4 pages" in run.stdout


@pytest.mark.slow
def test_course_site_has_every_notebook_and_no_broken_link(tmp_path):
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks, "no notebooks to build"
    site = tmp_path / "_site"
    run = subprocess.run([sys.executable, str(TOOL), "--out", str(site)], capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    for nb in notebooks:
        page = site / "notebooks" / f"{nb.stem}.html"
        assert page.is_file(), f"no page for {nb.name}"
        assert parse(page).links, f"{page.name} has no links (no lab bar?)"
    assert (site / "index.html").is_file()
    index_links = parse(site / "index.html").links
    assert not [u for u in index_links if u.split("#")[0].endswith((".ipynb", ".md"))
                and not urlsplit(u).scheme], "README links were not rewritten"
    assert broken_links(site) == []
