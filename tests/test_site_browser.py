"""The course site in a real browser, as a class sees it without Wi-Fi: the site built once per
session (tests/site_build.py, `make site`'s mkdocs build) is served on 127.0.0.1 and opened in
Debian's headless Chromium (driven by Playwright) with every request to another host aborted.
Lab 02's formula must be drawn (MathML, laid out, no TeX source left in the text); Chinese titles
must be drawn with real glyphs, not the empty boxes a system without a CJK font shows; the
header's language switch leads from a lab to the same lab in Chinese and back; the search box
finds a lab by a word of its own; a handout printed shows no sidebar, header or search. The
landing page is shot at a projector's 1,024 px. Screenshots are saved under the test's tmp_path.

`make test` installs /usr/bin/chromium and a Chinese font (mk/ui.mk) first; Playwright never
downloads a browser. Without Chromium the tests fail and say how to install it, unless
SKIP_BROWSER=1 asks explicitly to skip them."""
import functools
import http.server
import re
import shutil
import subprocess
import threading
from urllib.parse import urlsplit

import pytest

from .browser import CHROMIUM, require_chromium
from .site_build import course_site

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.lab01]

ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-gpu",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
TEX_LEFT = re.compile(r"\$[^$\n]*\\[A-Za-z]+[^$\n]*\$|\\\(|\\\[|\\begin\{|\\varepsilon")
CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")

# Draws each character of ``chars`` in ``element``'s font on a canvas, and an unassigned code
# point (U+0378) in the same font: a character with no glyph in any installed font is drawn
# as that same missing-glyph box, pixel for pixel. Returns the characters drawn as the box.
DRAWN_AS_BOX = """([element, chars]) => {
  const font = getComputedStyle(element).font;
  const draw = (ch) => {
    const canvas = document.createElement("canvas");
    canvas.width = canvas.height = 96;
    const ctx = canvas.getContext("2d");
    ctx.font = font.replace(/\\d+(\\.\\d+)?px/, "64px");
    ctx.fillText(ch, 8, 72);
    return Array.from(ctx.getImageData(0, 0, 96, 96).data).join(",");
  };
  const box = draw("\\u0378");
  return chars.filter((ch) => draw(ch) === box);
}"""


@pytest.fixture(scope="module")
def site_url(tmp_path_factory):
    """The course site, built from this repository, on http://127.0.0.1:PORT/."""
    require_chromium()
    site, run = course_site(tmp_path_factory)
    assert run.returncode == 0, f"mkdocs build failed:\n{run.stderr[-6000:]}"

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # one line per request would bury pytest's report
            pass
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture
def page(site_url):
    """A Chromium page that can reach 127.0.0.1 only; ``page.blocked`` lists what it tried."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1024, "height": 768})
            page.blocked = []

            def offline(route):
                if urlsplit(route.request.url).hostname == "127.0.0.1":
                    route.continue_()
                else:
                    page.blocked.append(route.request.url)
                    route.abort()
            page.route("**/*", offline)
            page.set_default_timeout(30_000)
            yield page
        finally:
            browser.close()


def assert_drawn_with_glyphs(page, element, what):
    chars = sorted(set(CJK.findall(element.inner_text())))
    assert chars, f"{what} has no Chinese characters to check"
    boxes = page.evaluate(DRAWN_AS_BOX, [element.element_handle(), chars])
    assert boxes == [], (f"{''.join(boxes)} in {what} drawn as missing-glyph boxes: no Chinese "
                         f"font. `make test` installs one (Debian: sudo apt-get install "
                         f"fonts-wqy-microhei)")


def test_formula_is_drawn_offline(page, site_url, tmp_path):
    page.goto(site_url + "notebooks/02_pytorch_essentials.html", wait_until="load")
    formula = page.locator(".md-content math").first
    formula.wait_for(state="visible")
    box = formula.bounding_box()
    assert box and box["width"] > 20 and box["height"] > 5, f"formula not laid out: {box}"
    # Laid out as MathML (Chromium's MathML Core), not as unknown inline elements.
    assert formula.evaluate("m => getComputedStyle(m).display") in ("math", "block math")
    assert "ε" in formula.text_content()  # inner_text is for HTML elements only
    # Prose only: code may hold a regex such as r"\(" that is no formula.
    text = "\n".join(page.locator(".jp-RenderedMarkdown").all_inner_texts())
    assert "finite difference" in text
    assert not TEX_LEFT.findall(text), f"TeX source visible: {TEX_LEFT.findall(text)[:3]}"
    formula.locator("xpath=..").screenshot(path=str(tmp_path / "lab02-formula.png"))
    assert page.blocked == [], f"the page tried to load from the internet: {page.blocked}"


@pytest.mark.parametrize("path", ["notebooks/07_conclusion_outlook.html",
                                  "zh/notebooks/02_pytorch_essentials.html"])
def test_chinese_title_is_drawn_with_glyphs(page, site_url, tmp_path, path):
    page.goto(site_url + path, wait_until="load")
    title = page.locator(".md-content h1").first
    title.screenshot(path=str(tmp_path / f"{path.replace('/', '-')}-title.png"))
    assert_drawn_with_glyphs(page, title, f"{path}'s title")
    fonts = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True,
                           timeout=60).stdout.strip() if shutil.which("fc-list") else ""
    assert fonts, "glyphs drawn, yet fc-list :lang=zh lists no Chinese font"
    assert page.blocked == [], f"the page tried to load from the internet: {page.blocked}"


def switch_language(page, hreflang):
    page.locator(".md-header__option .md-select > button").click()  # the header's menu
    page.locator(f'a.md-select__link[hreflang="{hreflang}"]').click()


def test_language_switch_goes_both_ways_and_chinese_is_drawn(page, site_url, tmp_path):
    """From an English lab the header's switch leads to the same lab in Chinese (zh/), whose
    title and sidebar are drawn with glyphs, and back; the Chinese landing page too."""
    name = "03d_communication_challenges"
    page.goto(f"{site_url}notebooks/{name}.html", wait_until="load")
    switch_language(page, "zh")
    page.wait_for_url(f"**/zh/notebooks/{name}.html")
    assert page.locator("html").get_attribute("lang") == "zh"
    assert_drawn_with_glyphs(page, page.locator(".md-content h1").first, f"zh/{name}'s title")
    sidebar = page.locator(".md-sidebar--primary .md-nav__item--section > label").first
    assert_drawn_with_glyphs(page, sidebar, "the Chinese sidebar's section")
    page.screenshot(path=str(tmp_path / f"zh-{name}.png"))
    switch_language(page, "en")
    page.wait_for_url(f"**/notebooks/{name}.html")
    assert "/zh/" not in page.url

    page.goto(f"{site_url}zh/index.html", wait_until="load")
    assert_drawn_with_glyphs(page, page.locator(".md-content h1").first, "the Chinese landing")
    assert page.locator(".md-content ol li a").count() >= 20  # the labs, in order
    assert page.blocked == [], f"the page tried to load from the internet: {page.blocked}"


def search(page, url, word):
    """Type ``word`` into the search box of the page at ``url``: the results' links."""
    page.goto(url, wait_until="load")
    query = page.locator("input.md-search__input")
    if not query.is_visible():  # narrow screens: the search opens from the header's button
        page.locator('label.md-header__button[for="__search"]').first.click()
    query.fill(word)
    page.locator(".md-search-result__item a").first.wait_for(state="visible")
    return page.locator(".md-search-result__item a").evaluate_all(
        "links => links.map(a => a.getAttribute('href'))")


def test_search_finds_a_lab_by_its_own_word(page, site_url):
    hrefs = search(page, site_url + "index.html", "Hogwild")
    assert any("03b_sync_async_sgd" in href for href in hrefs), hrefs
    assert page.blocked == [], f"the page tried to load from the internet: {page.blocked}"


def test_search_finds_a_chinese_word_inside_a_sentence(page, site_url):
    # "bubble": inside sentences, never set off by spaces
    hrefs = search(page, site_url + "zh/index.html", "气泡")
    assert any("06a2_pipeline_schedules" in href for href in hrefs), hrefs


def test_landing_reads_at_1024_px_and_a_handout_prints_without_the_site_around_it(
        page, site_url, tmp_path):
    page.goto(site_url + "index.html", wait_until="load")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1024  # no sideways scroll
    labs = page.locator(".md-content ol > li")
    assert labs.count() >= 20 and "make lab" in page.locator(".md-content").inner_text()
    page.screenshot(path=str(tmp_path / "landing-1024.png"))

    page.goto(site_url + "handouts/04a_ddp_from_scratch.html", wait_until="load")
    assert page.locator(".md-sidebar--primary").is_visible()
    page.emulate_media(media="print")
    for part in (".md-header", ".md-sidebar--primary", ".md-sidebar--secondary", ".md-footer"):
        assert not page.locator(part).first.is_visible(), f"{part} is printed on the handout"
    assert page.locator(".md-content img").first.is_visible()  # a key figure
    assert page.locator(".lu-page-break").first.evaluate(
        "e => getComputedStyle(e).breakBefore") == "page"
    page.pdf(path=str(tmp_path / "handout-04a.pdf"))
    assert page.blocked == [], f"the page tried to load from the internet: {page.blocked}"
