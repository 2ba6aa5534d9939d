"""The static course site in a real browser, as a class sees it without Wi-Fi: the site built
from this repository is served on 127.0.0.1 and opened in Debian's headless Chromium (driven by
Playwright) with every request to another host aborted. Lab 02's formula must be drawn (MathML,
laid out, no TeX source left in the text) and the Chinese chapter titles must be drawn with
real glyphs, not the empty boxes a system without a CJK font shows. The Chinese edition (zh/) is
reached through a lab's language switch and back, and its text is drawn with glyphs too.
Screenshots of the formula and of the titles are saved under the test's tmp_path.

`make test` installs /usr/bin/chromium and a Chinese font (mk/ui.mk) first; Playwright never
downloads a browser. Without Chromium the tests fail and say how to install it, unless
SKIP_BROWSER=1 asks explicitly to skip them."""
import functools
import http.server
import importlib.util
import re
import shutil
import subprocess
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from .browser import CHROMIUM, require_chromium

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.lab01]

ROOT = Path(__file__).resolve().parent.parent
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
    spec = importlib.util.spec_from_file_location("build_site", ROOT / "tools" / "build_site.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    site = tmp_path_factory.mktemp("site")
    assert tool.build_site(ROOT, site) == []

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
            page = browser.new_page(viewport={"width": 1200, "height": 900})
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


def test_formula_is_drawn_offline(page, site_url, tmp_path):
    page.goto(site_url + "notebooks/02_pytorch_essentials.html", wait_until="load")
    formula = page.locator("math").first
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


@pytest.mark.parametrize("name", ["07_conclusion_outlook", "02_pytorch_essentials"])
def test_chinese_title_is_drawn_with_glyphs(page, site_url, tmp_path, name):
    page.goto(f"{site_url}notebooks/{name}.html", wait_until="load")
    title = page.locator("h1").first
    chars = sorted(set(CJK.findall(title.inner_text())))
    assert chars, f"{name}'s title has no Chinese characters to check"
    title.screenshot(path=str(tmp_path / f"{name}-title.png"))
    boxes = page.evaluate(DRAWN_AS_BOX, [title.element_handle(), chars])
    assert boxes == [], (f"{''.join(boxes)} in {name}'s title drawn as missing-glyph boxes: no "
                         f"Chinese font. `make test` installs one (Debian: sudo apt-get install "
                         f"fonts-wqy-microhei)")
    fonts = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True,
                           timeout=60).stdout.strip() if shutil.which("fc-list") else ""
    assert fonts, "glyphs drawn, yet fc-list :lang=zh lists no Chinese font"
    assert page.blocked == [], f"the page tried to load from the internet: {page.blocked}"


def assert_drawn_with_glyphs(page, element, what):
    chars = sorted(set(CJK.findall(element.inner_text())))
    assert chars, f"{what} has no Chinese characters to check"
    boxes = page.evaluate(DRAWN_AS_BOX, [element.element_handle(), chars])
    assert boxes == [], f"{''.join(boxes)} in {what} drawn as missing-glyph boxes: no Chinese font"


def test_language_switch_goes_both_ways_and_chinese_is_drawn(page, site_url, tmp_path):
    """The Chinese edition (zh/): from an English lab its switch leads to the same lab in
    Chinese, whose title, bar and prose are drawn with glyphs, and back; the Chinese index too."""
    name = "03d_communication_challenges"
    page.goto(f"{site_url}notebooks/{name}.html", wait_until="load")
    page.locator("a.lu-lang").click()
    page.wait_for_url(f"**/zh/notebooks/{name}.html")
    assert page.locator("html").get_attribute("lang") == "zh-CN"
    assert_drawn_with_glyphs(page, page.locator("h1").first, f"zh/{name}'s title")
    assert_drawn_with_glyphs(page, page.locator("nav.lu-nav a").first, "the Chinese lab bar")
    language_cell = page.locator(".jp-CodeCell", has_text="set_language").first
    assert_drawn_with_glyphs(page, language_cell, "the language cell's comment")
    page.screenshot(path=str(tmp_path / f"zh-{name}.png"))
    page.locator("a.lu-lang").click()
    page.wait_for_url(f"**/notebooks/{name}.html")
    assert "/zh/" not in page.url

    page.goto(f"{site_url}zh/index.html", wait_until="load")
    assert_drawn_with_glyphs(page, page.locator("h1").first, "the Chinese index's title")
    assert page.locator("table a").count() >= 1  # the course map's labs
    page.locator("a.lu-lang").click()
    page.wait_for_url(site_url + "index.html")
    assert page.blocked == [], f"the page tried to load from the internet: {page.blocked}"
