"""Students' working copies (tools/student_copies.py): `make lab` opens my-labs/, never notebooks/."""
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import student_copies  # noqa: E402


def _outputs(path):
    return sum(len(c.get("outputs", [])) for c in json.loads(path.read_text())["cells"])


def test_sync_copies_every_lab_once_with_its_outputs_cleared(tmp_path):
    copied = student_copies.sync("en", tmp_path)
    reference = student_copies.labs("en")
    assert copied == [p.stem for p in reference] and len(copied) >= 10
    first = tmp_path / reference[0].name
    assert _outputs(reference[0]) > 0 and _outputs(first) == 0   # students run it themselves
    ref_cells = nbformat.read(reference[0], as_version=4).cells
    assert [c.source for c in nbformat.read(first, as_version=4).cells] == [c.source for c in ref_cells]
    first.write_text(first.read_text().replace("Central question", "My notes"))
    assert student_copies.sync("en", tmp_path) == []            # a copy is never overwritten
    assert "My notes" in first.read_text()


def test_reset_restores_one_lab_or_all_and_names_an_unknown_one(tmp_path):
    student_copies.sync("zh", tmp_path)
    chinese = student_copies.labs("zh")
    a, b = (tmp_path / "zh" / p.name for p in chinese[:2])
    for p in (a, b):
        p.write_text("edited")
    assert student_copies.reset([chinese[0].stem], "zh", tmp_path) == [chinese[0].stem]
    assert a.read_text() != "edited" and _outputs(a) == 0 and b.read_text() == "edited"
    assert len(student_copies.reset([], "zh", tmp_path)) == len(chinese)
    assert b.read_text() != "edited"
    with pytest.raises(SystemExit, match="no lab named 99_nothing; the labs are: 01_introduction"):
        student_copies.reset(["99_nothing"], "zh", tmp_path)


def test_the_copies_sit_where_relative_links_still_resolve():
    # my-labs/ and my-labs/zh/ have the depth of notebooks/ and notebooks/zh/
    assert student_copies.dest_dir("en").parent == ROOT == student_copies.source_dir("en").parent
    assert student_copies.dest_dir("zh").parent.parent == ROOT


@pytest.mark.slow
def test_running_and_saving_a_copy_leaves_git_status_clean_and_reset_restores_it():
    """What `make lab` does, then a student's run saved over the copy: git sees nothing."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=60).stdout
    before = git("status", "--porcelain", "--untracked-files=all")
    name = "01_introduction"
    copy = student_copies.DEST / f"{name}.ipynb"
    saved = copy.read_text() if copy.exists() else None
    try:
        student_copies.sync("en")
        nb = nbformat.read(copy, as_version=4)
        nb.cells[0].source += "\n\nmy answer"
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs = [nbformat.v4.new_output("stream", text="a run's output\n")]
        nbformat.write(nb, copy)
        assert git("status", "--porcelain", "--untracked-files=all") == before
        assert git("check-ignore", str(copy)).strip() != ""
        subprocess.run(["make", "-s", "reset", f"LAB={name}"], cwd=ROOT, check=True,
                       capture_output=True, timeout=120)
        assert "my answer" not in copy.read_text() and _outputs(copy) == 0
    finally:
        if saved is not None:
            copy.write_text(saved)


def test_jupyterlab_news_and_update_check_are_off():
    overrides = json.loads((ROOT / "tools" / "jupyterlab" / "overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"] == {
        "fetchNews": "false", "checkForUpdates": False}
    makefile = (ROOT / "Makefile").read_text()
    assert "cp tools/jupyterlab/overrides.json $(LAB_OVERRIDES)" in makefile
    assert "share/jupyter/lab/settings/overrides.json" in makefile
