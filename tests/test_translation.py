"""The Chinese edition (issue 18): notebooks/zh/ is built from the English labs and the
translation catalogs translations/zh/<lab>.md by tools/zh_catalog.py, never edited by hand.
Every lab has a catalog and a Chinese notebook; the catalogs are complete and current (an
English cell changed after its translation fails here, naming the cell); each committed Chinese
notebook is what the tool builds now; translated code is the English code; the stored outputs
show no missing-glyph warning; `make lab LANG=zh` finds its settings and language pack. No
process is started."""
import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = (ROOT / "translations" / "zh" / "jupyterlab-settings" / "@jupyterlab"
            / "translation-extension" / "plugin.jupyterlab-settings")


def load_tool():
    spec = importlib.util.spec_from_file_location("zh_catalog", ROOT / "tools" / "zh_catalog.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


zh = load_tool()
LABS = zh.labs()


def test_every_english_lab_has_a_catalog_and_a_chinese_notebook():
    assert LABS, "no English labs found"
    missing = [f"translations/zh/{lab}.md" for lab in LABS
               if not (zh.CATALOG_DIR / f"{lab}.md").exists()]
    missing += [f"notebooks/zh/{lab}.ipynb" for lab in LABS
                if not (zh.ZH_DIR / f"{lab}.ipynb").exists()]
    assert missing == [], "missing (run make zh): " + ", ".join(missing)
    strays = sorted(p.name for p in zh.ZH_DIR.glob("*.ipynb") if p.stem not in LABS)
    assert strays == [], f"Chinese notebooks of no English lab: {strays}"


def test_the_catalogs_and_the_chinese_notebooks_have_no_problem():
    """tools/zh_catalog.py check: every catalog entry present, its hash current (else the
    English changed since it was translated), translated code equal to the English code, and
    every committed Chinese notebook equal, cell by cell, to what `build` makes now (so a hand
    edit or a stale build fails, naming the cell)."""
    problems = zh.check()
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("lab", LABS)
def test_committed_chinese_notebook_is_the_build(lab):
    built = zh.build_notebook(lab, zh.read_notebook(zh.EN_DIR / f"{lab}.ipynb"),
                              zh.read_catalog(lab))
    committed = zh.read_notebook(zh.ZH_DIR / f"{lab}.ipynb")
    assert zh.stale_cells(built, committed) == [], f"run: python tools/zh_catalog.py build {lab}"
    assert built["cells"][0]["cell_type"] == "markdown"
    language = next(c for c in committed["cells"] if c["cell_type"] == "code")
    assert language["id"] == zh.LANGUAGE_CELL_ID
    assert 'lu.set_language("zh")' in zh.source(language)
    assert committed["metadata"]["kernelspec"] == \
        zh.read_notebook(zh.EN_DIR / f"{lab}.ipynb")["metadata"]["kernelspec"]


def drifted_copy(lab):
    """The lab's English notebook with its first markdown cell and the first comment of a
    translated code cell changed (in memory), a catalog current for the unchanged notebook (its
    skeleton: independent of how far the translation is) and the ids of the two cells."""
    nb = zh.read_notebook(zh.EN_DIR / f"{lab}.ipynb")
    entries = zh.parse(zh.skeleton(lab))
    markdown = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    markdown["source"] = zh.source(markdown) + "\n\nA sentence added to the English."
    code = next(c for c in nb["cells"] if c["cell_type"] == "code" and c["id"] in entries
                and "# " in zh.source(c) and not zh.source(c).lstrip().startswith("# NBVAL"))
    lines = zh.source(code).splitlines()
    i = next(i for i, line in enumerate(lines) if "# " in line and "NBVAL" not in line)
    lines[i] += " (reworded)"
    code["source"] = "\n".join(lines)
    return nb, entries, {markdown["id"], code["id"]}


@pytest.mark.parametrize("lab", ["03d_communication_challenges", "06b_tensor_parallel"])
def test_a_changed_english_cell_fails_the_drift_check_naming_it(lab):
    nb, entries, changed = drifted_copy(lab)
    assert zh.catalog_problems(lab, zh.read_notebook(zh.EN_DIR / f"{lab}.ipynb"), entries) == []
    problems = zh.catalog_problems(lab, nb, entries)
    assert len(problems) == 2, problems
    named = {p.split("cell ")[1].split(" ")[0] for p in problems}
    assert named == changed
    assert all("the English changed since it was translated" in p for p in problems)
    with pytest.raises(zh.CatalogError) as refused:
        zh.build_notebook(lab, nb, entries)
    assert refused.value.problems == problems


def test_a_missing_entry_and_a_stray_entry_are_named():
    lab = "03d_communication_challenges"
    nb = zh.read_notebook(zh.EN_DIR / f"{lab}.ipynb")
    entries = zh.parse(zh.skeleton(lab))  # current for this notebook
    first = next(iter(entries))
    del entries[first]
    entries["notacell"] = {"type": "markdown", "en": "0" * 12, "zh": "多余"}
    problems = zh.catalog_problems(lab, nb, entries)
    assert len(problems) == 2, problems
    assert f"cell {first} " in problems[0] and "has no translation" in problems[0]
    assert "cell notacell" in problems[1] and "remove it" in problems[1]


def test_code_difference_allows_only_comments_and_strings():
    en = 'x = torch.ones(3)  # one tensor\nprint(f"{x.sum():.1f} in total")\n'
    assert zh.code_difference(en, 'x = torch.ones(3)  # 一个张量\nprint(f"共 {x.sum():.1f}")\n') \
        is None
    assert "'ones' vs 'zeros'" in zh.code_difference(
        en, 'x = torch.zeros(3)  # 一个张量\nprint(f"{x.sum():.1f} in total")\n')
    assert zh.code_difference(en, en + "y = 1\n") is not None  # a statement added
    assert zh.code_difference(en, 'x = torch.ones(3)\nprint(f"{x.sum():.1f}", "")\n') is not None


def test_links_that_leave_notebooks_are_rewritten_for_notebooks_zh():
    labs = {"01_introduction", "02_pytorch_essentials"}
    text = ("[next](02_pytorch_essentials.ipynb#Part-2), [code](../labutils/core/timing.py), "
            "[map](../README.md), [data](../data/README.md), [paper](https://arxiv.org/abs/1), "
            "[here](#Summary), <img src=\"figures/a.png\">")
    assert zh.rewrite_links(text, labs) == (
        "[next](02_pytorch_essentials.ipynb#Part-2), [code](../../labutils/core/timing.py), "
        "[map](../../README.md), [data](../../data/README.md), [paper](https://arxiv.org/abs/1), "
        "[here](#Summary), <img src=\"../figures/a.png\">")


@pytest.mark.parametrize("lab", LABS)
def test_stored_outputs_show_no_missing_glyph_warning(lab):
    nb = zh.read_notebook(zh.ZH_DIR / f"{lab}.ipynb")
    texts = [json.dumps(o, ensure_ascii=False) for c in nb["cells"] for o in c.get("outputs", [])]
    bad = [t[:200] for t in texts if "missing from current font" in t or "Glyph" in t]
    assert bad == [], f"{lab}: a plot drew characters its font lacks: {bad[0]}"


def test_chinese_jupyterlab_settings_and_language_pack():
    """`make lab LANG=zh` points JUPYTERLAB_SETTINGS_DIR at a copy of this setting; the pack
    (requirements.txt) registers the zh_CN locale that JupyterLab's server looks up."""
    assert json.loads(SETTINGS.read_text(encoding="utf-8")) == {"locale": "zh_CN"}
    packs = importlib.metadata.entry_points(group="jupyterlab.languagepack")
    assert "zh_CN" in {ep.name for ep in packs}, "pip install -r requirements.txt"
    assert importlib.util.find_spec("jupyterlab_language_pack_zh_CN") is not None
    requirements = (ROOT / "requirements.txt").read_text()
    assert "jupyterlab-language-pack-zh-cn==" in requirements
    makefile = (ROOT / "Makefile").read_text()
    assert "JUPYTERLAB_SETTINGS_DIR" in makefile and "notebooks/zh" in makefile


def test_check_on_a_copy_with_a_changed_english_cell_names_it(tmp_path, monkeypatch, capsys):
    """The command itself (`python tools/zh_catalog.py check`), on a copy of the repository's
    notebooks whose English lab changed in one markdown cell and one comment: exit status 1,
    both cells named, and `build` refuses."""
    lab = "03d_communication_challenges"
    nb, _, changed = drifted_copy(lab)
    en_dir = tmp_path / "notebooks"
    en_dir.mkdir()
    (en_dir / f"{lab}.ipynb").write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    (tmp_path / "catalogs").mkdir()
    (tmp_path / "catalogs" / f"{lab}.md").write_text(zh.skeleton(lab), encoding="utf-8")
    monkeypatch.setattr(zh, "EN_DIR", en_dir)
    monkeypatch.setattr(zh, "ZH_DIR", en_dir / "zh")
    monkeypatch.setattr(zh, "CATALOG_DIR", tmp_path / "catalogs")
    assert zh.main(["check", lab]) == 1
    out = capsys.readouterr().out
    assert {line.split("cell ")[1].split(" ")[0] for line in out.splitlines()} == changed
    assert zh.main(["build", lab]) == 1
    assert not (en_dir / "zh" / f"{lab}.ipynb").exists()
    err = capsys.readouterr().err
    assert all(f"cell {cid} " in err for cid in changed), err


@pytest.mark.slow
def test_make_lab_lang_zh_opens_the_chinese_edition_with_a_valid_locale():
    """`make -n` prints the commands: LANG=zh selects notebooks/zh and the Chinese settings,
    and Jupyter gets a real locale (C.UTF-8), not LANG=zh; plain `make lab` stays English."""
    import subprocess

    def dry_run(*args):
        return subprocess.run(["make", "-n", "lab", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=60, env={"PATH": "/usr/bin:/bin",
                                                          "LANG": "C.UTF-8"}).stdout
    zh_run = dry_run("LANG=zh")
    launch = zh_run[zh_run.index("jupyter lab") - 200:]
    assert "LANG=C.UTF-8 " in launch and "LANG=zh " not in launch
    assert "JUPYTERLAB_SETTINGS_DIR=" in launch and "root_dir=notebooks/zh" in launch
    assert "plugin.jupyterlab-settings" in zh_run  # copied for this launch
    en_run = dry_run()
    assert "JUPYTERLAB_SETTINGS_DIR" not in en_run and "root_dir=notebooks " in en_run


def test_carry_keeps_the_chinese_of_unchanged_comments_and_strings_on_changed_code():
    old_en = "x = f(1)  # the first\ny = 'two words'\n"
    old_zh = "x = f(1)  # 第一个\ny = '两个词'\n"
    new_en = "x = g(1, 2)  # the first\nz = h(\n    'two words')\n"
    carried = zh.carry_code(old_en, old_zh, new_en)
    assert carried == "x = g(1, 2)  # 第一个\nz = h(\n    '两个词')\n"
    assert zh.code_difference(new_en, carried) is None      # the same code, token for token
    # a comment or string the old English did not have is left for a translator
    assert zh.carry_code(old_en, old_zh, "x = 1  # a new comment\n") is None
    assert zh.carry_code(old_en, old_zh, "x = 'another sentence here'\n") is None
