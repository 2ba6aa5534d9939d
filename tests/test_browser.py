"""A knob panel in a real browser: JupyterLab on 127.0.0.1 (temporary token, port, runtime and
settings dirs) driven by Playwright in Debian's headless Chromium. Runs the notebook's cells,
moves a slider, clicks Run, and checks that the plot is redrawn for the new value, the run
reached the ranks, and no error shows. Saves a screenshot under the test's tmp_path.

`make test` and `make ui-test` (mk/ui.mk) install /usr/bin/chromium with apt-get first;
Playwright never downloads a browser. Without Chromium the test fails and says how to install
it, unless SKIP_BROWSER=1 asks explicitly to skip it."""
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from .browser import CHROMIUM, require_chromium

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.lab01]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NOTEBOOK = os.path.join(HERE, "fixtures", "panel_demo.ipynb")

# JupyterLab's news and update toasts would cover the page; a fresh profile would ask.
LAB_SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                {"fetchNews": "false", "checkForUpdates": False},
                "@jupyterlab/notebook-extension/tracker.jupyterlab-settings":
                {"autoStartDefaultKernel": False}}


def api(base, token, method, path, body=None):
    """One call to the Jupyter server's REST API; the decoded JSON reply."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{base}{path}", data=data, method=method,
                                 headers={"Authorization": f"token {token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read()
    return json.loads(text) if text else None


def start_notebook_kernel(base, token, path):
    """Create the notebook's session (and kernel) through the REST API; returns the kernel id.

    Left to the page, JupyterLab sometimes shut the kernel it had just started down again and
    kept its websocket on the dead one ("Kernel never reached an 'alive' state"; 2 of 5 runs on
    a loaded machine). With the session made first the page finds it by path and attaches, and
    nothing starts or stops a kernel behind it. (The server reports the kernel "starting" until
    a client connects, so the page, not this function, waits for it to be idle.)"""
    session = api(base, token, "POST", "/api/sessions",
                  {"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}})
    return session["kernel"]["id"]


def wait_for_page_kernel(base, token, kernel_id, timeout=120):
    """Wait until the page holds a websocket to the kernel and the kernel is idle.

    JupyterLab's toolbar can show "Idle" before the notebook's session context has its kernel;
    a Run All clicked then finds "no kernel" and opens the Select Kernel dialog (seen in 3 of
    11 runs). The server counts each page's websocket per kernel, so wait for that instead."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kernel = api(base, token, "GET", f"/api/kernels/{kernel_id}")
        if kernel.get("connections", 0) >= 1 and kernel["execution_state"] == "idle":
            return
        time.sleep(0.3)
    raise AssertionError(f"the page did not connect to kernel {kernel_id} within {timeout} s: "
                         f"{kernel}")


def start_server(cmd, env, runtime_dir, log, timeout=90, tries=3):
    """Start ``cmd`` (a Jupyter server on ``--ServerApp.port=0``) until one answers; returns
    (process, port). The server binds a port the OS picks and writes it to its runtime file
    (``jpserver-<pid>.json``): nothing here picks a port that another process could take before
    the server binds it. jupyter_server 2.21 still binds port 0 once to learn a number and then
    listens on that number; should another process take it in between, the server exits
    ("could not be started") and a fresh one is started, at most ``tries`` times."""
    for attempt in range(tries):
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        info = runtime_dir / f"jpserver-{proc.pid}.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                server = json.loads(info.read_text())
                with urllib.request.urlopen(f"http://127.0.0.1:{server['port']}/api/status?"
                                            f"token={server['token']}", timeout=2) as r:
                    if r.status == 200:
                        return proc, server["port"]
            except (OSError, ValueError, KeyError):  # not written, half written, not listening
                time.sleep(0.3)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            raise AssertionError(f"jupyter lab did not answer within {timeout} s")
    raise AssertionError(f"jupyter lab exited with code {proc.returncode}, {tries} times")


@pytest.fixture
def jupyter_lab(tmp_path):
    """(base URL, token) of a JupyterLab serving a copy of the fixture notebook; every
    process it started (kernel, forkserver, ranks) is ended afterwards."""
    with serve_lab(tmp_path, NOTEBOOK, "panel_demo.ipynb") as served:
        yield served


@contextlib.contextmanager
def serve_lab(tmp_path, notebook, name):
    """The JupyterLab of ``jupyter_lab``, serving a copy of ``notebook`` as ``name``."""
    require_chromium()
    root, home = tmp_path / "root", tmp_path / "home"
    root.mkdir(), home.mkdir()
    shutil.copy(notebook, root / name)
    # as the labs store it: the language_info that this kernel reports (nbconvert wrote it into
    # the executed labs), so that opening the notebook changes nothing in it
    with open(os.path.join(ROOT, "notebooks", "01_introduction.ipynb")) as f:
        language_info = json.load(f)["metadata"]["language_info"]
    with open(root / name) as f:
        demo = json.load(f)
    demo["metadata"]["language_info"] = language_info
    with open(root / name, "w") as f:
        json.dump(demo, f, indent=1)
    settings = tmp_path / "lab-settings"
    for rel, value in LAB_SETTINGS.items():
        (settings / rel).parent.mkdir(parents=True, exist_ok=True)
        (settings / rel).write_text(json.dumps(value))
    token = secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_DATA_DIR=str(tmp_path / "data"), IPYTHONDIR=str(tmp_path / "ipython"),
               HOME=str(home), PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           "--ServerApp.port=0", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           f"--LabApp.user_settings_dir={settings}",
           f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp_path / "jupyter.log", "wb")
    proc, port = start_server(cmd, env, tmp_path / "runtime", log)
    base = f"http://127.0.0.1:{port}"
    try:
        yield base, token, proc
    finally:
        family = [proc.pid] + [p.pid for p in _descendants(proc.pid)]
        proc.send_signal(signal.SIGTERM)  # the server shuts its kernels down on SIGTERM
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            pass
        _kill_left(family)
        log.close()
        left = [pid for pid in family if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert not left, f"processes left behind: {left}"


def _descendants(pid):
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _kill_left(pids):
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    for p in procs:
        for child in _descendants(p.pid):
            if child not in procs:
                procs.append(child)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def chromium(pw, tmp_path, width, height):
    """Debian's headless Chromium in a fresh profile under ``tmp_path``: its context."""
    return pw.chromium.launch_persistent_context(
        str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True,
        args=["--no-sandbox", "--disable-background-networking", "--disable-gpu",
              "--disable-dev-shm-usage"],
        viewport={"width": width, "height": height})


def run_all_cells(page, expect, tries=3):
    """Run > Run All Cells once the kernel is idle, until the first code cell has run. (While
    JupyterLab is still settling its kernel a click can be lost; a kernel dialog is answered.)"""
    first_prompt = page.locator(".jp-CodeCell .jp-InputPrompt").first
    for _ in range(tries):
        dialog = page.locator(".jp-Dialog").get_by_role("button", name="Select")
        if dialog.count():
            dialog.click()
        try:
            expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")) \
                .to_have_count(1, timeout=90_000)
        except AssertionError:
            # The page lost its kernel connection while loading: reloading reconnects it to the
            # same session.
            page.reload(timeout=120_000)
            expect(page.locator(".jp-Notebook")).to_be_visible(timeout=120_000)
            continue
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
        try:
            expect(first_prompt).to_have_text(re.compile(r"\[(\*|\d+)\]"), timeout=20_000)
            return
        except AssertionError:
            page.keyboard.press("Escape")
    raise AssertionError(f"Run All Cells did not start the cells in {tries} tries")


def show_panel(page, expect, tries=3):
    """Wait for the panel of the last cell. When the kernel creates a widget before the
    page's widget manager listens (a JupyterLab start-up race, most likely on a loaded machine)
    the output says "model not found"; running that cell again shows it."""
    panel = page.locator(".lu-panel")
    not_found = page.get_by_text("model not found")
    for _ in range(tries):
        expect(panel.or_(not_found).first).to_be_visible(timeout=120_000)
        if panel.count():
            return panel
        page.locator(".jp-CodeCell").last.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        expect(not_found).to_have_count(0, timeout=60_000)
    raise AssertionError(f"the panel was not displayed in {tries} tries")


def test_panel_runs_in_jupyterlab_in_chromium(jupyter_lab, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    base, token, server = jupyter_lab
    with sync_playwright() as pw:
        context = chromium(pw, tmp_path, 1280, 1000)
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(60_000)
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            kernel_id = start_notebook_kernel(base, token, "panel_demo.ipynb")
            page.goto(f"{base}/lab/tree/panel_demo.ipynb?token={token}", timeout=120_000)

            # The page attaches to the session's kernel; once it is connected, run every cell.
            expect(page.locator(".jp-Notebook")).to_be_visible(timeout=120_000)
            wait_for_page_kernel(base, token, kernel_id)
            expect(page.locator(".jp-KernelName")).not_to_have_text("No Kernel")
            # the stored kernelspec is the installed one: opening it does not modify the file
            page.wait_for_timeout(1000)
            expect(page.locator(".lm-TabBar-tab.jp-mod-dirty")).to_have_count(0)
            run_all_cells(page, expect)
            sessions = api(base, token, "GET", "/api/sessions")
            assert len(sessions) == 1 and len(api(base, token, "GET", "/api/kernels")) == 1, \
                sessions

            panel = show_panel(page, expect)
            run = panel.locator("button", has_text=re.compile(r"^\s*Run\s*$"))
            expect(panel).to_contain_text("ready")
            n_slider = panel.locator(".widget-hslider").filter(
                has=page.locator("label", has_text=re.compile(r"^n$")))
            readout = n_slider.locator(".widget-readout")
            expect(readout).to_have_text("4")

            # First run with the default n = 4: a plot appears.
            run.click()
            plot = panel.locator(".jp-OutputArea-output img")
            expect(plot).to_have_count(1, timeout=180_000)
            expect(panel).to_contain_text("done in", timeout=60_000)
            first_src = plot.get_attribute("src")

            # Move the slider (keyboard on its handle), run again: the plot is replaced.
            n_slider.locator(".noUi-handle").focus()
            page.keyboard.press("ArrowRight")
            page.keyboard.press("ArrowRight")
            expect(readout).to_have_text("6")
            run.click()
            expect(panel.get_by_text("[rank 0] step 5")).to_be_visible(timeout=120_000)
            expect(plot).to_have_count(1, timeout=60_000)
            expect(plot).not_to_have_attribute("src", first_src, timeout=60_000)
            expect(run).to_be_enabled(timeout=60_000)
            expect(panel).to_contain_text("steps 6/6")

            # More ranks than cores: the launcher's warning shows in the panel's log as one
            # plain line (no file path), not as a stderr box in the notebook.
            ws_slider = panel.locator(".widget-hslider").filter(
                has=page.locator("label", has_text=re.compile(r"^world_size$")))
            ws_slider.locator(".noUi-handle").focus()
            for _ in range(6):
                page.keyboard.press("ArrowRight")
            expect(ws_slider.locator(".widget-readout")).to_have_text("8")
            page.wait_for_timeout(1000)  # the slider's last value reaches the kernel
            run.click()
            if len(os.sched_getaffinity(0)) < 8:
                expect(panel).to_contain_text("warning: 8 ranks on", timeout=180_000)
                expect(run).to_be_enabled(timeout=180_000)
                warned = [line for line in panel.inner_text().splitlines()
                          if "oversubscription" in line]
                assert warned and all("/" not in line and ".py" not in line
                                      for line in warned), warned
            page.wait_for_timeout(500)  # let the image paint before the screenshot
            panel.scroll_into_view_if_needed()
            page.screenshot(path=str(tmp_path / "panel.png"), full_page=True)

            assert "error:" not in panel.inner_text()
            assert page.locator("[data-mime-type='application/vnd.jupyter.error']").count() == 0
            assert page.locator("[data-mime-type='application/vnd.jupyter.stderr']").count() == 0
            assert errors == []
        except BaseException:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            raise
        finally:
            context.close()
    assert (tmp_path / "panel.png").stat().st_size > 10_000
    assert server.poll() is None  # the server was up all along; the fixture ends it


def test_a_lab_presents_as_slides_with_rise(tmp_path):
    """Issue 31: a teacher presents a lab as live slides. JupyterLab opens lab 01; the
    notebook toolbar's RISE button ("Render the current notebook as Reveal Slideshow", the
    command RISE:preview of jupyterlab-rise from requirements.txt) opens the slideshow beside
    the notebook, where reveal.js shows the first slide (tools/slides.py made the first cell
    one) with the lab's title and central question, and its arrow moves to the next slide."""
    from playwright.sync_api import expect, sync_playwright

    lab = "01_introduction.ipynb"
    with open(os.path.join(ROOT, "notebooks", lab), encoding="utf-8") as f:
        title = "".join(json.load(f)["cells"][0]["source"]).splitlines()[0].lstrip("# ")
    with serve_lab(tmp_path, os.path.join(ROOT, "notebooks", lab), lab) as (base, token, _), \
            sync_playwright() as pw:
        context = chromium(pw, tmp_path, 1024, 768)  # a projector
        page = context.pages[0] if context.pages else context.new_page()
        try:
            page.set_default_timeout(60_000)
            page.goto(f"{base}/lab/tree/{lab}?token={token}", timeout=120_000)
            expect(page.locator(".jp-Notebook")).to_be_visible(timeout=120_000)
            page.get_by_role("button", name=re.compile("as Reveal Slideshow")).click()
            deck = page.frame_locator("iframe").last.locator(".reveal")
            present = deck.locator(".slides > section.present")
            expect(present).to_be_visible(timeout=120_000)
            expect(present).to_contain_text(title, timeout=60_000)
            expect(present).to_contain_text("Central question")
            page.wait_for_timeout(1000)  # let the slide paint before the screenshot
            page.screenshot(path=str(tmp_path / "slides.png"))
            deck.locator(".controls .navigate-right").click()  # the next slide
            expect(deck.locator(".slides > section.present")).not_to_contain_text(
                "Central question", timeout=30_000)
        except BaseException:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            raise
        finally:
            context.close()
    assert (tmp_path / "slides.png").stat().st_size > 10_000


def _widest_figure_lab():
    """The English lab whose widest stored figure is widest."""
    from .test_projector import _png_width, _stored_figures
    widths = {}
    for path, _, png in _stored_figures():
        if path.parent.name == "notebooks":
            widths[path.name] = max(widths.get(path.name, 0), _png_width(png))
    return max(widths, key=widths.get)


def test_figures_show_at_their_own_size_on_a_1024_px_projector(tmp_path):
    """Issue 31: figures read on a projector. JupyterLab at 1,024 x 768 opens the lab with the
    widest stored figure; with the file browser closed (Ctrl+B, as a teacher projects) the
    output area is at least labutils.viz.style.OUTPUT_PX wide, and every figure is drawn at its
    own width, not scaled down (tests/test_projector.py keeps each stored figure within it)."""
    from playwright.sync_api import expect, sync_playwright

    from labutils.viz import style

    lab = _widest_figure_lab()
    with serve_lab(tmp_path, os.path.join(ROOT, "notebooks", lab), lab) as (base, token, _), \
            sync_playwright() as pw:
        context = chromium(pw, tmp_path, 1024, 768)
        page = context.pages[0] if context.pages else context.new_page()
        try:
            page.set_default_timeout(60_000)
            page.goto(f"{base}/lab/tree/{lab}?token={token}", timeout=120_000)
            expect(page.locator(".jp-Notebook")).to_be_visible(timeout=120_000)
            left = page.locator("#jp-left-stack")
            for _ in range(3):   # a key pressed while the page still settles can be lost
                if not left.is_visible():
                    break
                page.locator(".jp-Notebook").click()
                page.keyboard.press("Control+b")
                page.wait_for_timeout(1000)
            expect(left).to_be_hidden()
            images = page.locator(".jp-OutputArea-output img")
            expect(images.first).to_be_visible()
            page.wait_for_function("[...document.querySelectorAll('.jp-OutputArea-output img')]"
                                   ".every(i => i.complete && i.naturalWidth > 0)")
            area = page.locator(".jp-OutputArea-output").evaluate_all(
                "outs => Math.min(...outs.map(o => o.clientWidth))")
            shown = images.evaluate_all(
                "imgs => imgs.map(i => [i.naturalWidth, i.getBoundingClientRect().width])")
            page.screenshot(path=str(tmp_path / "projector.png"))
        finally:
            context.close()
    assert area >= style.OUTPUT_PX, f"the output area is {area} px at 1,024 px"
    assert shown and all(abs(natural - width) < 1 for natural, width in shown), shown
