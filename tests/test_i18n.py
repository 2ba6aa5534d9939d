"""The language setting (``lu.set_language``): every sentence labutils writes into a notebook
goes through ``core.i18n.tr`` with a literal English template, the Chinese catalogs
(``labutils/<package>/locale/zh.po``, tools/zh_messages.py) cover each one with the same
placeholders and hold nothing else, and switching back to English gives the English text exactly
(the committed English notebooks compare it under nbval)."""
from __future__ import annotations

import ast
import importlib.util
import re
import string
import warnings
from pathlib import Path

import matplotlib
import polib
import pytest
import torch.distributed as dist

import labutils as lu
from labutils.core import i18n
from labutils.core.memory import TERMS
from labutils.core.timeline import Span
from labutils.core.timing import Stats, versus
from labutils.exercises import lab01, lab02
from labutils.viz import figures, plots, timeline_plot, widgets

from .checkers import square_function
from .test_collectives import _reduce_scatter_only
from .test_lab03b_exercise import _fresh

matplotlib.use("Agg")

PACKAGE = Path(lu.__file__).parent
CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
CATALOGS = sorted(PACKAGE.glob("*/locale/zh.po")) + [PACKAGE / "locale" / "zh.po"]


def _messages_tool():
    path = PACKAGE.parent / "tools" / "zh_messages.py"
    spec = importlib.util.spec_from_file_location("zh_messages", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


zm = _messages_tool()
# {English template: Chinese} of the tr() entries (the course map's have a msgctxt)
MESSAGES = {e.msgid: e.msgstr for path in CATALOGS for e in polib.pofile(str(path))
            if not e.obsolete and e.msgctxt is None}


@pytest.fixture(autouse=True)
def english_after():
    """Every test starts and ends in English, so no other test sees another language."""
    i18n.set_language("en")
    yield
    i18n.set_language("en")


# ---- the catalog -----------------------------------------------------------------------------

def _tr_calls():
    """(file, line, first argument node) of every ``tr(...)`` call in labutils."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and (
                    (isinstance(node.func, ast.Name) and node.func.id == "tr")
                    or (isinstance(node.func, ast.Attribute) and node.func.attr == "tr")):
                yield path.relative_to(PACKAGE.parent), node.lineno, (node.args or [None])[0]


def _fields(template):
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def test_every_tr_call_has_a_literal_template():
    calls = list(_tr_calls())
    assert len(calls) > 100          # the scan finds the call sites (a broken scan finds none)
    bad = [f"{path}:{line}" for path, line, arg in calls
           if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str))]
    assert not bad, f"tr() needs a literal English template as first argument: {bad}"


def test_the_catalog_translates_every_template_and_nothing_else():
    used = {arg.value for _, _, arg in _tr_calls()}
    missing = sorted(used - set(MESSAGES))
    unused = sorted(set(MESSAGES) - used)
    assert not missing, f"no Chinese for: {missing} (python tools/zh_messages.py update)"
    assert not unused, f"catalog entries no code uses: {unused}"
    untranslated = sorted(k for k, v in MESSAGES.items() if not v)
    assert not untranslated, f"no Chinese for: {untranslated}"


def test_babel_extracts_every_tr_call_the_syntax_tree_has():
    """The catalogs are made by Babel's extractor: it must see each call (it does not look
    inside f-strings, so a tr() there would go untranslated)."""
    by_ast = {(str(path), arg.value) for path, _, arg in _tr_calls()}
    by_babel = {(str(Path("labutils") / f), m) for m, files in zm.extract().items()
                for f in files}
    assert by_ast - by_babel == set(), "tr() inside an f-string? move the call out of it"
    assert by_babel - by_ast == set()


def test_each_template_lives_in_the_lowest_package_that_prints_it():
    owner = {}
    for path in CATALOGS:
        for e in polib.pofile(str(path)):
            if e.msgctxt is None and not e.obsolete:
                assert e.msgid not in owner, f"{e.msgid!r} in {owner.get(e.msgid)} and {path}"
                owner[e.msgid] = path.parent.parent.name
    layers = lu.course.LAYERS
    for message, files in zm.extract().items():
        packages = {Path(f).parts[0] for f in files if len(Path(f).parts) > 1}
        lowest = min(packages, key=layers.index) if packages else "labutils"
        assert owner[message] == lowest, (message, files)


def test_a_long_previous_msgid_stays_one_line_that_polib_reads(tmp_path):
    """Babel wraps a fuzzy entry's old English (``#|``) into lines that are no PO syntax."""
    from babel.messages.catalog import Catalog
    old = "an old template {x}" + " long enough to wrap" * 6
    catalog = Catalog(locale="zh_CN")
    catalog.add("a new template {x}", "旧 {x}", flags=("fuzzy",), previous_id=(old,))
    path = tmp_path / "zh.po"
    path.write_text(zm.render(catalog), encoding="utf-8")
    assert polib.pofile(str(path))[0].previous_msgid == old


def test_the_message_catalogs_pass_the_tool_check():
    """tools/zh_messages.py check: in step with the code, all translated, placeholders equal."""
    assert zm.check(msgfmt=False) == []


@pytest.mark.slow
def test_msgfmt_check_format_passes_the_catalogs_and_fails_a_wrong_placeholder(tmp_path):
    """gettext's own check of python-brace-format entries (run by the tool in CI)."""
    import shutil
    import subprocess
    if not shutil.which("msgfmt"):
        pytest.skip("gettext's msgfmt is not installed")
    for path in CATALOGS:
        done = subprocess.run(["msgfmt", "--check-format", "-o", "/dev/null", str(path)],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    catalog = zm.new_catalog()
    catalog.add("expected {e}, got {g}", "应为 {e}，实际为 {x}")
    (tmp_path / "zh.po").write_text(zm.render(catalog), encoding="utf-8")
    assert "msgfmt --check-format" in " ".join(zm.catalog_problems(tmp_path / "zh.po"))


def test_the_format_check_names_a_wrong_placeholder(tmp_path):
    path = tmp_path / "zh.po"
    catalog = zm.new_catalog()
    catalog.add("expected {e}, got {g}", "应为 {e}，实际为 {x}")
    path.write_text(zm.render(catalog), encoding="utf-8")
    assert "#, python-brace-format" in path.read_text(encoding="utf-8")
    problems = zm.catalog_problems(path, msgfmt=False)
    assert problems and "['e', 'x']" in problems[0], problems
    right = zm.new_catalog()
    right.add("expected {e}, got {g}", "应为 {e}，实际为 {g}")
    path.write_text(zm.render(right), encoding="utf-8")
    assert zm.catalog_problems(path, msgfmt=False) == []


def test_a_fuzzy_entry_falls_back_to_english_as_in_gettext(tmp_path, monkeypatch):
    catalog = zm.new_catalog()
    catalog.add("expected {e}, got {g}", "应为 {e}，实际为 {g}", flags=("fuzzy",))
    catalog.add("none", "无")
    (tmp_path / "core" / "locale").mkdir(parents=True)
    (tmp_path / "core" / "locale" / "zh.po").write_text(zm.render(catalog), encoding="utf-8")
    monkeypatch.setattr(i18n, "_PACKAGE", tmp_path)
    assert i18n._load("zh") == {(None, "none"): "无"}


@pytest.mark.parametrize("template", sorted(MESSAGES))
def test_chinese_uses_the_same_placeholders(template):
    chinese = MESSAGES[template]
    assert _fields(chinese) == _fields(template)
    assert chinese.strip() and chinese != template
    assert CJK.search(chinese), "a translation with no Chinese character"


def test_unknown_language_names_the_choices():
    with pytest.raises(ValueError, match=r"'fr'.*'en', 'zh'"):
        lu.set_language("fr")
    assert lu.language() == "en"


def test_the_face_sets_the_language_and_tr_formats_both():
    lu.set_language("zh")
    assert lu.language() == "zh"
    assert i18n.tr("expected {e}, got {g}", e=1, g=2) == "应为 1，实际为 2"
    lu.set_language("en")
    assert i18n.tr("expected {e}, got {g}", e=1, g=2) == "expected 1, got 2"


# ---- what a notebook prints ------------------------------------------------------------------

def test_versus_default_words_follow_the_language_and_given_words_do_not():
    fast = Stats.of([1.0, 0.9, 1.1, 0.95, 1.05, 1.02, 0.98])
    slow, near = Stats.of([2 * v for v in fast.values]), Stats.of(reversed(fast.values))
    assert [versus(fast, slow), versus(slow, fast), versus(fast, near)] == [
        "faster than", "slower than", "not measurably different from"]
    lu.set_language("zh")
    assert [versus(fast, slow), versus(slow, fast), versus(fast, near)] == [
        "快于", "慢于", "不显著异于"]
    assert versus(fast, slow, less="少于", more="多于") == "少于"   # the notebook's own words
    lu.set_language("en")
    assert versus(slow, fast, less="smaller than", more="larger than") == "larger than"


def test_verdict_sentences_are_whole_templates_in_each_language():
    """``Comparison.sentence``: one template per outcome, so the Chinese puts "not measurably
    different" after both names (「A 与 B 差异不显著」), which one fragment between the names
    cannot; the interval follows in the same language."""
    from labutils.core.timing import compare
    fast = Stats.of([1.0, 0.9, 1.1, 0.95, 1.05, 1.02, 0.98])
    slow, near = Stats.of([2 * v for v in fast.values]), Stats.of(reversed(fast.values))
    english = [compare(x, y, paired=True).sentence("A", "B")
               for x, y in ((fast, slow), (slow, fast), (fast, near))]
    assert [e.split(":")[0] for e in english] == [
        "On this run A was faster than B", "On this run A was slower than B",
        "On this run A and B were not measurably different"]
    assert english[0].endswith("x (95% CI 0.5-0.5, 7 paired rounds)")
    lu.set_language("zh")
    try:
        chinese = [compare(x, y, paired=True).sentence("环形", "递归倍增")
                   for x, y in ((fast, slow), (slow, fast), (fast, near))]
    finally:
        lu.set_language("en")
    assert [c.split("：")[0] for c in chinese] == [
        "本次运行中，环形快于递归倍增", "本次运行中，环形慢于递归倍增",
        "本次运行中，环形与递归倍增差异不显著"]
    assert all("倍（95% 置信区间" in c and "7 个配对回合" in c for c in chinese)


def test_machine_report_lines():
    report = lu.env.EnvReport(cores=2, memory_gb=8.04, gpus=(), backends={"gloo": True,
                              "nccl": False}, torch_version="2.13.0", python_version="3.11.7",
                              system="Linux x86_64", recommended_world_sizes=(1, 2))
    english = report.lines()
    assert english == ["logical CPUs this process may use (affinity mask): 2", "memory: 8.0 GB", "GPUs: none",
                       "backends: gloo yes, nccl no", "torch 2.13.0, Python 3.11.7, Linux x86_64",
                       ("recommended world sizes: 1, 2 (one rank per core; more ranks share "
                       "cores)")]
    lu.set_language("zh")
    chinese = report.lines()
    assert chinese[0] == "本进程可用的逻辑 CPU（亲和性掩码）：2" and chinese[1] == "内存：8.0 GB"
    assert all(CJK.search(line) for i, line in enumerate(chinese) if i != 4)
    lu.set_language("en")
    assert report.lines() == english


def test_panel_labels_follow_the_language():
    english = widgets.panel(lambda n=1: n, n=(1, 3))
    lu.set_language("zh")
    chinese = widgets.panel(lambda n=1: n, n=(1, 3))
    assert (chinese.run_button.description, chinese.stop_button.description,
            chinese.status.value) == ("运行", "停止", "就绪")
    chinese._on_progress(2, 5, "steps")
    assert chinese.progress_label.value == "步 2/5"
    assert (english.run_button.description, english.stop_button.description,
            english.status.value) == ("Run", "Stop", "ready")


# ---- checkers ----------------------------------------------------------------------------------

_HalfSquare = square_function(lambda x, grad_output: x * grad_output)


SQUARE_EN = ("[wrong] square: case 1 of 3 (x of shape [3]): wrong gradient: x * grad_output is "
             "half of it: d(x**2)/dx = 2x")


def test_a_single_process_checker_speaks_chinese_then_english_again():
    assert lu.check_square(_HalfSquare).message == SQUARE_EN
    lu.set_language("zh")
    assert lu.check_square(_HalfSquare).message == (
        "[错误] square：共 3 个用例，第 1 个未通过（x 的形状为 [3]）：梯度错误：x * grad_output "
        "只是一半：d(x**2)/dx = 2x")
    lu.set_language("en")
    assert lu.check_square(_HalfSquare).message == SQUARE_EN


def _sums(rank, world_size):
    t = lab01.start(rank, world_size)
    dist.all_reduce(t)
    return t


MAX_EN = ("[wrong] max_allreduce: case 1 of 2 (world_size=2, seed={seed}): rank 0, for 'holds', "
          "expected 'the elementwise max over all ranks', got 'the sum: all_reduce sums unless "
          "op=ReduceOp.MAX'")


@pytest.mark.slow
def test_a_multi_rank_checker_composes_its_words_in_the_notebooks_language():
    """The words of this message are made on the ranks (the harness names what each rank
    holds): they are Chinese only if the language reached the ranks."""
    english = lu.check_max_allreduce(_sums).message
    seed = re.search(r"seed=(\d+)", english).group(1)
    assert english == MAX_EN.format(seed=seed)
    lu.set_language("zh")
    chinese = lu.check_max_allreduce(_sums).message
    assert chinese == (f"[错误] max_allreduce：共 2 个用例，第 1 个未通过（world_size=2, seed={seed}）"
                       f"：rank 0，对于 '内容'，应为 '所有 rank 的逐元素最大值'，实际为 "
                       f"'这是总和：除非 op=ReduceOp.MAX，all_reduce 默认求和'")
    passed = lu.check_max_allreduce(lab01.max_allreduce).message
    assert passed == "[通过] max_allreduce：2 个用例全部通过（进程总数 2, 3）"
    lu.set_language("en")
    assert lu.check_max_allreduce(_sums).message == english


@pytest.mark.slow
def test_checkers_still_name_the_typical_mistake_in_chinese():
    """03a's and 03b's checkers add what a typical mistake means after the failing case; the
    message's tag is Chinese in the Chinese edition, and the diagnosis must still come."""
    lu.set_language("zh")
    ring = lu.check_ring_all_reduce(_reduce_scatter_only).message
    assert ring.startswith("[错误] ring_all_reduce：")
    assert "只在第" in ring and "之后还需 p - 1 步全收集" in ring
    stale = lu.check_stale_update(_fresh).message
    assert stale.startswith("[错误] stale_update：") and "这是同步随机梯度下降（SGD），陈旧度为 0" in stale


def test_not_implemented_and_count_messages():
    def stub(t):
        raise NotImplementedError
    assert lu.check_count_graph_nodes(stub).message == (
        "[to do] count_graph_nodes: not implemented yet; fill in the lines marked # FILL ME IN")
    lu.set_language("zh")
    assert lu.check_count_graph_nodes(stub).message == (
        "[待完成] count_graph_nodes：尚未实现；请补全标有 # FILL ME IN 的代码行")
    assert lu.check_count_graph_nodes(lab02.count_graph_nodes).message == (
        "[通过] count_graph_nodes：3 个计算图全部通过")


# ---- figures keep English labels ---------------------------------------------------------------

def _figures():
    """Every labutils figure function, drawn on small inputs like the labs'."""
    s = [Stats.of([1.0, 1.2, 1.1]), Stats.of([2.0, 2.4, 2.2])]
    spans = [Span(0, "forward", 0.0, 1.0, "F0"), Span(0, "backward", 1.0, 3.0, "B0"),
             Span(1, "allreduce", 0.5, 2.5, "bucket 0"), Span(1, "wait", 2.5, 3.0)]
    sweep = [{"m": m, "predicted_bubble": 1 / (m + 1), "measured_bubble": 1 / (m + 1),
              "predicted_throughput": 10 * m, "measured_throughput": 9 * m} for m in (1, 2, 4)]
    ddp = [{"variant": v, "link": link, "gbps": g, "predicted": 1.5, "measured": 1.0,
            "compute": s[0], "step": s[1]} for v in ("ddp", "naive")
           for link, g in (("1 Gb/s", 1.0), ("10 Gb/s", 10.0))]
    return {
        "plot_collectives": lambda: figures.plot_collectives(
            {"all_reduce": ([[1, 2], [3, 4]], [[4, 6], [4, 6]])}),
        "plot_all_reduce_times": lambda: figures.plot_all_reduce_times(
            [1024, 2048], {"ring": s}, 2, fits={"alpha-beta": [1.0, 2.0]}),
        "plot_runs": lambda: figures.plot_runs(
            [{"name": "sync", "examples": [1, 2], "loss": [1.0, 0.5], "time": [0.1, 0.2]}]),
        "plot_sweep": lambda: figures.plot_sweep(sweep, title="sweep"),
        "plot_memory": lambda: figures.plot_memory({"a": dict.fromkeys(TERMS, 2e6)},
                                                   measured={"a": 9e6}),
        "plot_emulated_ddp": lambda: figures.plot_emulated_ddp(ddp),
        "plot_bars": lambda: plots.plot_bars({"a": s[0], "b": 1.5}, ylabel="s", title="t"),
        "plot_lines": lambda: plots.plot_lines([1, 2], {"x": s}, xlabel="p", ylabel="s"),
        "plot_scaling": lambda: plots.plot_scaling({1: s[1], 2: s[0]}),
        "plot_timeline": lambda: timeline_plot.plot_timeline(spans, title="1f1b"),
        "plot_overlap": lambda: timeline_plot.plot_overlap(spans, title="overlap"),
    }


def test_every_figure_function_is_drawn_here():
    found = {name for module in (figures, plots, timeline_plot) for name in dir(module)
             if name.startswith("plot_") and callable(getattr(module, name))
             and getattr(module, name).__module__ == module.__name__}
    assert found == set(_figures())


# the figures whose own text (axis labels, legends, the ideal line) comes from labutils; the
# others draw only what the test passes them ("t", "s", "x")
DRAWS_OWN_TEXT = {"plot_collectives", "plot_all_reduce_times", "plot_runs", "plot_sweep",
                  "plot_memory", "plot_emulated_ddp", "plot_scaling", "plot_timeline",
                  "plot_overlap"}


def _drawn_texts(name):
    import matplotlib.pyplot as plt
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # a missing glyph warns: fail on it
        drawn = _figures()[name]()
        fig = drawn if hasattr(drawn, "savefig") else (
            drawn.figure if hasattr(drawn, "figure") else drawn[0].figure)
        fig.canvas.draw()
        texts = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
    plt.close(fig)
    return texts


@pytest.mark.parametrize("name", sorted(_figures()))
def test_figures_draw_chinese_text_in_chinese_mode_with_a_chinese_font(name):
    """lu.set_language("zh") puts a Chinese font after DejaVu Sans (viz/style.py): the figures'
    own labels are Chinese and no glyph is missing; in English no text is Chinese."""
    from matplotlib import rcParams
    family = rcParams["font.family"]
    try:
        lu.set_language("zh")
        if len(rcParams["font.family"]) < 2:
            pytest.fail("no Chinese font for matplotlib: install one (Debian/Ubuntu: apt-get "
                        "install fonts-wqy-microhei; `make test` does)")
        texts = _drawn_texts(name)
        assert texts
        assert any(CJK.search(t) for t in texts) == (name in DRAWS_OWN_TEXT), texts
        lu.set_language("en")
        assert not [t for t in _drawn_texts(name) if CJK.search(t)]
    finally:
        rcParams["font.family"] = family


def test_a_data_label_stays_the_english_key_and_shows_in_the_language():
    """N_ marks a label where it is defined (the English stays the key the code looks up);
    label() shows it: English by default, the catalog's Chinese under set_language("zh")."""
    from labutils.experiments import comm_spans, staleness  # noqa: F401 (their N_ marks)
    labels = {e.msgid: e.msgstr for path in CATALOGS for e in polib.pofile(str(path))
              if e.msgctxt == i18n.LABEL and not e.obsolete}
    assert labels["straggler"] == "有掉队者" and labels["no overlap"] == "不重叠"
    assert i18n.N_("straggler") == "straggler" == i18n.label("straggler")
    i18n.set_language("zh")
    assert i18n.label("straggler") == "有掉队者" and i18n.label("not a label") == "not a label"
    marked = set(zm.extract("N_"))
    assert marked == set(labels), "python tools/zh_messages.py update"


def _rank_id(rank, world_size):
    return rank


@pytest.mark.slow
def test_oversubscription_warning_keeps_its_category_and_speaks_the_language(monkeypatch):
    from labutils.core import launcher
    monkeypatch.setattr(launcher, "cpu_count", lambda: 1)
    lu.set_language("zh")
    with pytest.warns(UserWarning, match=r"^2 个 rank 运行在 1 个核心上：.*超额订阅"):
        assert lu.launch(_rank_id, world_size=2, threads_per_rank=1) == [0, 1]
    lu.set_language("en")
    with pytest.warns(UserWarning, match=r"^2 ranks on 1 cores: ranks will share cores "
                                         r"\(oversubscription\), so timings will be slower "
                                         r"than with 1 ranks$"):
        lu.launch(_rank_id, world_size=2, threads_per_rank=1)


def test_table_columns_align_right_where_asked_and_refuse_a_wrong_spec():
    from labutils.core.tables import text_table
    lines = text_table([("a", 1), ("bb", 100)], ["名", "数量"], align="lr").splitlines()
    assert lines == ["名  数量", "a      1", "bb   100"]
    with pytest.raises(ValueError, match="one letter, l or r, per column"):
        text_table([("a", 1)], ["x", "y"], align="l")


def test_tables_pad_by_display_width_so_chinese_headers_align():
    """A Chinese character takes two columns of a monospaced font (East Asian width W/F):
    ``text_table`` pads by display width, so each column starts at the same column in every
    row, Chinese or English, where ``str.ljust`` (characters) would shift it by one per
    character."""
    from labutils.core.tables import display_width, pad, text_table

    assert display_width("算法") == 4 and display_width("ring") == 4
    assert display_width("（全角）") == 8 and display_width("e\u0301") == 1  # combining accent
    assert pad("环形", 6) == "环形  " and pad("toolong", 3) == "toolong"
    lines = text_table([("环形算法", 1.5, "x"), ("recursive-doubling", 22.25, "是")],
                       ["算法", "毫秒", "说明"]).splitlines()

    def starts(line):  # display column of each column's first character
        out, col, prev = [], 0, " "
        for ch in line:
            if ch != " " and prev == " ":
                out.append(col)
            col, prev = col + display_width(ch), ch
        return out
    assert [starts(line) for line in lines] == [[0, 20, 27]] * 3
    assert text_table([], ["列"]) == "列"
