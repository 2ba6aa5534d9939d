"""The Chinese edition (issues 18, 25): notebooks/zh/ is built from the English labs and the
gettext catalogs translations/zh/<lab>.po by tools/zh_catalog.py, never edited by hand. Every lab
has a catalog and a Chinese notebook; each committed Chinese notebook is what the tool builds now
(so the migration from the .md catalogs reproduced every Chinese cell); translated code is the
English code. On a copy of the repository: a one-word English edit makes one cell fuzzy, which
warns (with its English diff) and fails only `check --release` / `make release`; a Chinese-only
change keeps the stored outputs; changed code with unchanged comments carries its Chinese over.
The stored outputs show no missing-glyph warning; `make lab EDITION=zh` finds its settings and
language pack. Processes are started only by the tests marked slow."""
import importlib.metadata
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = (ROOT / "translations" / "zh" / "jupyterlab-settings" / "@jupyterlab"
            / "translation-extension" / "plugin.jupyterlab-settings")


def load_tool(path=ROOT / "tools" / "zh_catalog.py", name="zh_catalog"):
    spec = importlib.util.spec_from_file_location(f"{name}_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


zh = load_tool()
zm = load_tool(ROOT / "tools" / "zh_migrate.py", "zh_migrate")
zh.CJK = re.compile(r"[\u4e00-\u9fff]")
LABS = zh.labs()


def test_every_english_lab_has_a_catalog_and_a_chinese_notebook():
    assert LABS, "no English labs found"
    missing = [f"translations/zh/{lab}.po" for lab in LABS if not zh.catalog_path(lab).exists()]
    missing += [f"notebooks/zh/{lab}.ipynb" for lab in LABS
                if not (zh.ZH_DIR / f"{lab}.ipynb").exists()]
    assert missing == [], "missing (run make zh): " + ", ".join(missing)
    strays = sorted(p.name for p in zh.ZH_DIR.glob("*.ipynb") if p.stem not in LABS)
    assert strays == [], f"Chinese notebooks of no English lab: {strays}"


def test_the_catalogs_and_the_chinese_notebooks_have_no_problem():
    """tools/zh_catalog.py check: every catalog in step with its English notebook, translated
    code equal to the English code, every committed Chinese notebook equal, cell by cell, to
    what `build` makes now (so a hand edit or a stale build fails, naming the cell) and
    executed since its code last changed. Fuzzy cells are no error (they warn)."""
    problems, _ = zh.check()
    assert problems == [], "\n".join(problems)
    assert not list(zh.CATALOG_DIR.glob("0*.md")), "old catalogs: python tools/zh_catalog.py migrate"


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


# the lab the tests below edit; the fixture first marks its copied catalog fully translated (no
# fuzzy or untranslated entry), so they count exactly what one edit turns fuzzy
LAB = "05_model_parallel_principles"


def _as_if_fully_translated(tool):
    """Accept every fuzzy entry of the copy's catalog and fill every untranslated one (code with
    its English, which is valid code), then rebuild the copy's Chinese notebook, as if executed
    (a fuzzy code cell was built from its old code)."""
    po = tool.read_catalog(LAB)
    for e in po:
        if e.obsolete:
            continue
        if e.comment == "code" and ("fuzzy" in e.flags or not e.msgstr):
            e.msgstr = e.msgid
        elif not e.msgstr:
            e.msgstr = "（译文）" + e.msgid
        if "fuzzy" in e.flags:
            e.flags.remove("fuzzy")
        e.previous_msgid = None
    tool.write_catalog(LAB, po)
    path, stale = tool.build(LAB)
    if stale:
        nb = tool.read_notebook(path)
        for number, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
            cell["execution_count"] = number + 1
        path.write_text(tool.notebook_text(nb), encoding="utf-8")


@pytest.fixture
def copy_tool(tmp_path):
    """The tool run on a copy of the repository (its tools, one lab's English notebook, catalog
    and committed Chinese notebook): what it writes lands in tmp_path."""
    (tmp_path / "tools").mkdir()
    for path in [*(ROOT / "tools").glob("zh_*.py"), ROOT / "tools" / "codewrap.py"]:
        (tmp_path / "tools" / path.name).write_bytes(path.read_bytes())
    for rel in (f"notebooks/{LAB}.ipynb", f"notebooks/zh/{LAB}.ipynb",
                f"translations/zh/{LAB}.po"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes((ROOT / rel).read_bytes())
    tool = load_tool(tmp_path / "tools" / "zh_catalog.py")
    _as_if_fully_translated(tool)
    return tool


def edit_english(tool, change):
    """Apply ``change(cells)`` to the copy's English notebook."""
    path = tool.EN_DIR / f"{LAB}.ipynb"
    nb = tool.read_notebook(path)
    change(nb["cells"])
    path.write_text(json.dumps(nb, ensure_ascii=False, indent=1), encoding="utf-8")


def first_markdown_with(cells, word):
    return next(c for c in cells if c["cell_type"] == "markdown" and f" {word} " in zh.source(c))


def test_a_one_word_english_edit_turns_one_cell_fuzzy_and_only_warns(copy_tool, capsys):
    """The issue's "done when": the English edit makes exactly that cell fuzzy, with the English
    it translated kept; check prints the diff and exits 0 with a warning; the Chinese notebook
    shows the old Chinese under a notice and keeps its outputs; check --release fails."""
    tool, changed = copy_tool, {}

    def one_word(cells):
        cell = first_markdown_with(cells, "three")
        changed.update(id=cell["id"], old=zh.source(cell))
        cell["source"] = zh.source(cell).replace(" three ", " 3 ", 1)
    edit_english(tool, one_word)
    before = tool.read_notebook(tool.ZH_DIR / f"{LAB}.ipynb")
    assert tool.main(["build", LAB]) == 0
    fuzzy = [e for e in tool.read_catalog(LAB) if "fuzzy" in e.flags]
    assert [e.msgctxt for e in fuzzy] == [changed["id"]]
    assert fuzzy[0].previous_msgid == changed["old"] and " 3 " in fuzzy[0].msgid
    capsys.readouterr()
    assert tool.main(["check"]) == 0
    out, err = capsys.readouterr()
    assert f"cell {changed['id']} (markdown) is fuzzy" in out
    assert any(line.startswith("    -") and " three " in line for line in out.splitlines())
    assert any(line.startswith("    +") and " 3 " in line for line in out.splitlines())
    assert "warning: 1 fuzzy or untranslated cell(s)" in err and "0 problem(s)" in out
    after = tool.read_notebook(tool.ZH_DIR / f"{LAB}.ipynb")
    cell = next(c for c in after["cells"] if c["id"] == changed["id"])
    assert zh.source(cell).startswith(tool.NOTICE["markdown", True])
    assert zh.source(cell)[len(tool.NOTICE["markdown", True]):] == fuzzy[0].msgstr
    assert [c.get("outputs") for c in after["cells"]] == [c.get("outputs") for c in before["cells"]]
    assert not tool.needs_execution(after)
    assert tool.main(["check", "--release"]) == 1


@pytest.mark.slow
def test_make_release_fails_on_a_fuzzy_cell(copy_tool):
    """The Makefile's release recipe itself, run in the copy (STAMP= skips the venv step)."""
    import subprocess
    edit_english(copy_tool, lambda cells: first_markdown_with(cells, "three").update(
        source=zh.source(first_markdown_with(cells, "three")).replace(" three ", " 3 ", 1)))
    assert copy_tool.main(["build", LAB]) == 0
    done = subprocess.run(["make", "-f", str(ROOT / "Makefile"), "release", "STAMP=",
                           f"PY={sys.executable}"], cwd=copy_tool.ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0
    assert "is fuzzy" in done.stdout and "zh_catalog.py check --release" in done.stdout


def test_a_chinese_only_change_keeps_the_stored_outputs(copy_tool):
    tool = copy_tool
    po = tool.read_catalog(LAB)
    markdown = next(e for e in po if e.comment == "markdown" and e.translated())
    code = next(e for e in po if e.comment == "code" and e.translated() and "# " in e.msgstr)
    markdown.msgstr += "\n\n（译者补充一句。）"
    code.msgstr = code.msgstr.replace("# ", "# 译者修订：", 1)
    tool.write_catalog(LAB, po)
    before = tool.read_notebook(tool.ZH_DIR / f"{LAB}.ipynb")
    path, stale = tool.build(LAB)
    after = tool.read_notebook(path)
    assert not stale and tool.check([LAB]) == ([], [])
    assert [(c.get("outputs"), c.get("execution_count")) for c in after["cells"]] == \
        [(c.get("outputs"), c.get("execution_count")) for c in before["cells"]]
    sources = {c["id"]: zh.source(c) for c in after["cells"]}
    assert sources[markdown.msgctxt].endswith("（译者补充一句。）")
    assert "# 译者修订：" in sources[code.msgctxt]


def test_changed_code_with_the_same_comments_carries_over_and_needs_executing(copy_tool, capsys):
    """A reformat and a code-only change keep the Chinese comments and strings (no fuzzy); the
    lab is reported for execution, its changed cell without outputs."""
    tool, ids = copy_tool, {}
    translated = {e.msgctxt for e in tool.read_catalog(LAB) if e.comment == "code"}

    def recode(cells):
        cell = next(c for c in cells if c["id"] in translated)
        ids["cell"] = cell["id"]
        cell["source"] = "\n" + zh.source(cell).replace(" = ", " =  ", 1) + "\n_unused = 0"
    edit_english(tool, recode)
    assert tool.main(["build", LAB]) == 0
    assert "needs executing" in capsys.readouterr().out
    entry = next(e for e in tool.read_catalog(LAB) if e.msgctxt == ids["cell"])
    assert entry.translated() and "fuzzy" not in entry.flags
    assert entry.msgstr.endswith("_unused = 0") and zh.code_difference(entry.msgid,
                                                                       entry.msgstr) is None
    assert zh.CJK.search(entry.msgstr)
    built = tool.read_notebook(tool.ZH_DIR / f"{LAB}.ipynb")
    cell = next(c for c in built["cells"] if c["id"] == ids["cell"])
    assert cell["outputs"] == [] and tool.needs_execution(built)
    problems, _ = tool.check([LAB])
    assert [p for p in problems if "not executed since their code changed" in p]


def test_new_cells_are_untranslated_vanished_ones_obsolete_and_bad_code_an_error(copy_tool):
    tool = copy_tool
    gone = {}

    def reshape(cells):
        gone["id"] = cells[-1]["id"]
        del cells[-1]
        cells.insert(1, {"cell_type": "markdown", "id": "new-cell", "metadata": {},
                         "source": "A new paragraph."})
        cells.insert(2, {"cell_type": "code", "id": "new-code", "metadata": {}, "outputs": [],
                         "execution_count": None, "source": "%%time\nx = 1  # a new comment"})
    edit_english(tool, reshape)
    assert tool.update(LAB)
    po = tool.read_catalog(LAB)
    entries = {e.msgctxt: e for e in po}
    assert entries["new-cell"].msgstr == "" and not entries["new-cell"].obsolete
    assert entries[gone["id"]].obsolete and entries[gone["id"]].msgstr
    built = tool.build_notebook(LAB, tool.read_notebook(tool.EN_DIR / f"{LAB}.ipynb"), po)
    sources = {c["id"]: zh.source(c) for c in built["cells"]}
    assert sources["new-cell"] == tool.NOTICE["markdown", False] + "A new paragraph."
    assert sources["new-code"] == "%%time\n" + tool.NOTICE["code", False] + "x = 1  # a new comment"
    _, waiting = tool.check([LAB])
    assert {re.search(r": cell (\S+) \(", line).group(1) for line in waiting} == \
        {"new-cell", "new-code"}
    code = next(e for e in po if e.comment == "code" and e.translated())
    code.msgstr = code.msgstr.replace("(", "(0 + ", 1) if "(" in code.msgstr else "x = 0\n"
    problems = tool.catalog_problems(LAB, tool.read_notebook(tool.EN_DIR / f"{LAB}.ipynb"), po)
    assert len(problems) == 1 and f"cell {code.msgctxt} (code): code differs" in problems[0]
    with pytest.raises(tool.CatalogError):
        tool.build_notebook(LAB, tool.read_notebook(tool.EN_DIR / f"{LAB}.ipynb"), po)


def _old_format(po):
    """The issue-18 catalog text of a .po (what a translator had before the migration)."""
    lines = ["A comment for the translator.", ""]
    for e in po:
        if not e.obsolete:
            lines += [f"@@ cell {e.msgctxt} {e.comment} en={zm.en_hash(e.msgid)}", e.msgstr, ""]
    return "\n".join(lines)


@pytest.mark.parametrize("lab", LABS)
def test_the_migration_loses_nothing_and_is_repeatable(lab):
    """An old catalog converts to the same entries, all translated (the committed .po files
    were made so from the .md files; the Chinese notebooks built from them are the committed
    ones, test_committed_chinese_notebook_is_the_build). Only the translated entries are
    compared: a cell whose English changed since (fuzzy) or is new (untranslated) has no
    old-format Chinese to migrate."""
    po = zh.read_catalog(lab)
    done = [e for e in po if e.translated()]
    converted, notes = zm.convert(lab, _old_format(done))
    assert notes == []
    converted = [e for e in converted if e.msgctxt in {d.msgctxt for d in done}]
    assert [(e.msgctxt, e.msgid, e.msgstr, e.flags) for e in converted] == \
        [(e.msgctxt, e.msgid, e.msgstr, e.flags) for e in done]
    assert all(e.translated() for e in converted)


@pytest.mark.slow
def test_a_migrated_entry_whose_english_changed_is_fuzzy_with_the_english_from_git():
    """The entry's hash names an English text of an older commit: the migration finds it in
    git history (here: HEAD, with the cell changed in memory) and keeps it as #| msgid."""
    po = zh.read_catalog(LAB)
    entry = next(e for e in po if e.comment == "markdown")
    nb = zh.read_notebook(zh.EN_DIR / f"{LAB}.ipynb")
    cell = next(c for c in nb["cells"] if c["id"] == entry.msgctxt)
    assert zm.old_english(LAB, entry.msgctxt, zm.en_hash(zh.source(cell))) == zh.source(cell)
    assert zm.old_english(LAB, entry.msgctxt, "0" * 12) is None

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
    """`make lab EDITION=zh` points JUPYTERLAB_SETTINGS_DIR at a copy of this setting; the pack
    (requirements.txt) registers the zh_CN locale that JupyterLab's server looks up."""
    assert json.loads(SETTINGS.read_text(encoding="utf-8")) == {"locale": "zh_CN"}
    packs = importlib.metadata.entry_points(group="jupyterlab.languagepack")
    assert "zh_CN" in {ep.name for ep in packs}, "pip install -r requirements.txt"
    assert importlib.util.find_spec("jupyterlab_language_pack_zh_CN") is not None
    requirements = (ROOT / "requirements.txt").read_text()
    assert "jupyterlab-language-pack-zh-cn==" in requirements
    makefile = (ROOT / "Makefile").read_text()
    assert "JUPYTERLAB_SETTINGS_DIR" in makefile and "notebooks/zh" in makefile


@pytest.mark.slow
def test_make_lab_edition_is_chosen_only_by_an_explicit_setting():
    """`make -n` prints the commands: EDITION=zh (or the literal LANG=zh, no locale) selects the
    Chinese copies (my-labs/zh, made from notebooks/zh) and the Chinese settings, and Jupyter gets
    a real locale (C.UTF-8), not LANG=zh; plain `make lab` stays English, also where the locale
    is Chinese (zh_CN.UTF-8 in the environment or on the command line)."""
    import subprocess

    def dry_run(*args, lang="C.UTF-8"):
        return subprocess.run(["make", "-n", *(args or ("lab",))], cwd=ROOT, capture_output=True,
                              text=True, timeout=60, env={"PATH": "/usr/bin:/bin",
                                                          "LANG": lang}).stdout

    def assert_english(run):
        assert "JUPYTERLAB_SETTINGS_DIR" not in run and "root_dir=my-labs " in run
        assert "student_copies.py sync --edition en" in run

    for zh_run in (dry_run("lab", "EDITION=zh"), dry_run("lab", "LANG=zh"),
                   dry_run("lab", "EDITION=zh", lang="zh_CN.UTF-8")):
        launch = zh_run[zh_run.index("jupyter lab") - 200:]
        assert "LANG=zh " not in launch
        assert "JUPYTERLAB_SETTINGS_DIR=" in launch and "root_dir=my-labs/zh" in launch
        assert "plugin.jupyterlab-settings" in zh_run  # copied for this launch
        assert "student_copies.py sync --edition zh" in zh_run
    assert "LANG=C.UTF-8 " in dry_run("lab", "LANG=zh")
    assert_english(dry_run())
    assert_english(dry_run(lang="zh_CN.UTF-8"))
    assert_english(dry_run("lab", "LANG=zh_CN.UTF-8"))
    assert_english(dry_run("lab", "LANG=zh_TW.UTF-8"))
    assert "reset --edition zh 04a" in dry_run("reset", "EDITION=zh", "LAB=04a")
    assert "reset --edition en 04a" in dry_run("reset", "LAB=04a", lang="zh_CN.UTF-8")


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


def _english_tool():
    spec = importlib.util.spec_from_file_location("zh_english", ROOT / "tools" / "zh_english.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_english_scan_finds_sentences_and_passes_code_names_and_units():
    """tools/zh_english.py (run by `make release`): an English sentence in a Chinese output
    counts; code, quoted names, identifiers, paths, product and paper names, units and the
    messages of PyTorch itself do not."""
    scan = _english_tool()
    english = ["On this run one flat buffer was faster than one all-reduce per tensor.",
               "link       variant         step ms  speedup (of medians)  floor that binds",
               "compute only: 43.2 ms per step", "With the straggler, parameter server was 快于 sync"]
    for line in english:
        assert scan.english_sentences(line), line
    chinese = ["本次运行中，环形快于递归倍增：0.254 倍（95% 置信区间 0.17-0.41，27 个配对回合）",
               "rank 0 发送了 12288 bytes，rank 1 接收了 4 MiB",
               "配置「2 ranks, 1 thread each」的计算快于配置「1 rank, 1 thread」",
               "调用 `dist.all_reduce(tensor, op=ReduceOp.SUM)` 与 torch.distributed.pipelining",
               "ValueError: SyncBatchNorm expected input tensor to be on GPU or XPU",
               "Mann-Whitney 检验 p=0.17；PyTorch 的 DeviceMesh 与 Megatron", "ring  1.5  GB/s",
               "一个 rank 在 (pp, dp, cp, tp) 网格上的坐标",
               "检查点 <ckpt_dir>/step_000012 已损坏：rank_1.pt 有 N 字节"]
    for line in chinese:
        assert scan.english_sentences(line) == [], line


def test_the_english_scan_skips_listings_figures_and_widgets():
    scan = _english_tool()
    sentence = "the last worker sent most of the gradients\n"

    def cell(source, *outputs):
        return {"cell_type": "code", "source": source, "outputs": list(outputs)}
    nb = {"cells": [
        cell("lu.show_source(A.worker)", {"output_type": "stream", "text": sentence}),
        cell("plt.show()", {"output_type": "display_data",
                            "data": {"image/png": "...", "text/plain": "<Figure size 640x480>"}}),
        cell("panel", {"output_type": "display_data", "data": {
            "application/vnd.jupyter.widget-view+json": {}, "text/plain": sentence}}),
        cell("print(x)", {"output_type": "stream", "text": "最后一个工作进程\n" + sentence}),
        cell("show(y)", {"output_type": "display_data", "data": {"text/html": f"<b>{sentence}</b>"}}),
        {"cell_type": "markdown", "source": sentence}]}
    assert [(index, line) for index, line, _ in scan.scan_notebook(nb)] == [
        (3, sentence.strip()), (4, sentence.strip())]


def test_the_chinese_edition_prints_no_english_sentence():
    """Issue 32's bar, on the committed Chinese notebooks: every output line a student reads
    (tables, verdicts, errors, checker messages) is Chinese outside the allow-list of code,
    names and units."""
    scan = _english_tool()
    left = {path.stem: [line for _, line, _ in scan.scan_notebook(
                json.loads(path.read_text(encoding="utf-8")))]
            for path in sorted((ROOT / "notebooks" / "zh").glob("*.ipynb"))}
    assert len(left) == len(list((ROOT / "notebooks").glob("*.ipynb")))
    left = {lab: lines for lab, lines in left.items() if lines}
    assert not left, f"English in the Chinese edition's outputs: {left}"


def test_make_release_runs_the_english_scan():
    release = (ROOT / "Makefile").read_text().split("\nrelease:", 1)[1].split("\n\n", 1)[0]
    assert "tools/zh_english.py" in release
