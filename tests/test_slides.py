"""Every lab presents as slides (issue 31): tools/slides.py sets each cell's slideshow metadata
from the cells (a slide for the title and each ``## `` section), JupyterLab's RISE extension
shows it (pinned in requirements.txt; tests/test_browser.py presents a lab), and the Chinese
notebooks carry the English cells' metadata. No process is started."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("slides", ROOT / "tools" / "slides.py")
slides = importlib.util.module_from_spec(spec)
spec.loader.exec_module(slides)
LABS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def kinds(nb):
    return [c.get("metadata", {}).get("slideshow", {}).get("slide_type") for c in nb["cells"]]


@pytest.mark.parametrize("lab", LABS)
def test_each_lab_has_its_slides(lab):
    nb = load(ROOT / "notebooks" / f"{lab}.ipynb")
    found = slides.problems(nb)
    assert not found, (f"notebooks/{lab}.ipynb: slideshow metadata not as tools/slides.py sets "
                       f"it; fix: python tools/slides.py apply notebooks/{lab}.ipynb\n"
                       + "\n".join(found[:10]))
    got = kinds(nb)
    assert got[0] == "slide" and got.count("slide") >= 2  # the title, then sections
    headings = [k for c, k in zip(nb["cells"], got)
                if c["cell_type"] == "markdown" and "".join(c["source"]).startswith("## ")]
    assert set(headings) <= {"slide"}


@pytest.mark.parametrize("lab", LABS)
def test_the_chinese_lab_carries_the_english_slides(lab):
    en = load(ROOT / "notebooks" / f"{lab}.ipynb")
    zh = load(ROOT / "notebooks" / "zh" / f"{lab}.ipynb")
    english = {c["id"]: k for c, k in zip(en["cells"], kinds(en))}
    chinese = {c["id"]: k for c, k in zip(zh["cells"], kinds(zh))}
    assert kinds(zh)[0] == "slide"
    assert {i: k for i, k in chinese.items() if i in english} == english
    assert zh["metadata"].get("rise") == en["metadata"].get("rise") == slides.RISE


def test_slide_types_follow_the_cells():
    cells = [{"cell_type": "markdown", "source": "# Title\n**Central question.** Why?"},
             {"cell_type": "code", "source": "x = 1", "outputs": []},
             {"cell_type": "markdown", "source": "What x means."},
             {"cell_type": "markdown", "source": "## 1. A section"},
             {"cell_type": "code", "source": "\n".join(["y = 2"] * 30), "outputs": []},
             {"cell_type": "code", "source": "print(y)",
              "outputs": [{"output_type": "display_data", "data": {"image/png": "..."}}]},
             {"cell_type": "markdown", "source": "### A step"}]
    assert slides.slide_types(cells) == ["slide", "-", "fragment", "slide", "subslide",
                                         "subslide", "subslide"]
    nb = {"cells": [dict(c, metadata={}) for c in cells], "metadata": {}}
    once = json.dumps(slides.apply_to(nb))
    assert json.dumps(slides.apply_to(json.loads(once))) == once  # idempotent
    assert slides.problems(json.loads(once)) == []


def test_make_lab_installs_rise():
    pins = (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
    assert any(line.startswith("jupyterlab-rise==") for line in pins)
