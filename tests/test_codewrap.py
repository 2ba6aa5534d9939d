"""Code lines of at most 90 characters (issue 31: a projector at 1,024 px, a laptop without
horizontal scrolling), in both editions, and the tool that wraps them (tools/codewrap.py): it
keeps a cell's meaning (same AST), its tokens apart from line breaks, comments and the cuts of
adjacent string literals (so the Chinese edition keeps its outputs and translations), and
tools/zh_code.py sees a wrapped cell as the same code. No process is started."""
import ast
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))  # codewrap and zh_build import their siblings


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cw = _load("codewrap")
zc = _load("zh_code")
NOTEBOOKS = sorted(ROOT.glob("notebooks/*.ipynb")) + sorted(ROOT.glob("notebooks/zh/*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_line_fits_90_characters(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    long = [f"cell {cell.get('id')}: {len(line)} characters: {line.strip()[:50]}..."
            for cell in nb["cells"] if cell["cell_type"] == "code"
            for line in "".join(cell["source"]).splitlines() if len(line) > 90]
    assert not long, (f"{path.relative_to(ROOT)} has code lines over 90 characters; fix: "
                      f"python tools/codewrap.py apply {path.stem}, then python "
                      f"tools/zh_catalog.py build {path.stem}:\n" + "\n".join(long))


CELL = '''\
# NBVAL_IGNORE_OUTPUT
# a comment that is long enough to need two lines when the limit is as small as the one here
result = some_function(first_argument, second_argument, third_argument=3, fourth=[1, 2, 3])
total = 1 + 2  # a trailing comment that makes this line much longer than the limit allows
print(f"a printed sentence with {total} in it, long enough to be cut into two literals", total)
message = "a long string outside any bracket that only a backslash can continue, here"
def helper(x):
    """A docstring whose one line is longer than the limit, so its words move to a new
    line."""
    return [value * 2 for value in range(x) if value % 2 == 0 and value > 10 and value < 99]
'''


def test_wrap_keeps_the_meaning_and_fits_the_limit():
    wrapped, left = cw.wrap(CELL, limit=60)
    assert not left, left
    assert all(len(line) <= 60 for line in wrapped.splitlines())
    assert wrapped.splitlines()[0] == "# NBVAL_IGNORE_OUTPUT"
    assert ast.dump(ast.parse(wrapped)) != ast.dump(ast.parse(CELL))  # only the docstring
    assert cw.same_meaning(CELL, wrapped)
    assert zc.code_key(wrapped) == zc.code_key(CELL)  # the Chinese edition keeps its outputs
    assert zc.code_difference(CELL, wrapped) is None
    assert "# a trailing comment" in wrapped and "total = 1 + 2\n" in wrapped
    assert cw.wrap(wrapped, limit=60) == (wrapped, [])  # idempotent


def test_wrap_refuses_what_would_change_the_code():
    # A string that only an f-string field could split: left as it is, and reported.
    code = 'x = f"{[round(v / 1e9, 2) for v in range(40) if v % 3 == 0 and v % 5 == 0]}"\n'
    wrapped, left = cw.wrap(code, limit=40)
    assert wrapped == code and left == [code.rstrip("\n")]
    assert not cw.same_meaning('print("a" "b")\n', 'print("ab ")\n')


def test_chinese_comments_and_strings_break_between_characters():
    code = ("# 中文注释很长很长，需要拆成好几行才能放得下，"
            "每一行都不超过限制，而且不能切断英文单词 word\n"
            "print(\"这是一个很长的中文句子，打印出来给学生看，"
            "长度超过了限制，所以要拆成两个字面量\", 1)\n")
    wrapped, left = cw.wrap(code, limit=40)
    assert not left and cw.same_meaning(code, wrapped)
    lines = wrapped.splitlines()
    assert lines[0].startswith("# ") and lines[1].startswith("# ") and lines[0].endswith("，")
    assert lines[2].startswith('print("') and lines[3].lstrip().startswith('"')


def test_a_fuzzy_cell_keeps_its_chinese_after_a_rewrap():
    old_en = 'x = 1  # a long comment here\nprint("hello world", x)\n'
    old_zh = 'x = 1  # 一个长注释\nprint("你好 世界", x)\n'
    new_en = '# a long\n# comment here\nx = 1\nprint("hello "\n      "world", x)\n'
    want = '# 一个长注释\nx = 1\nprint("你好 世界", x)\n'
    assert zc.carry_code(old_en, old_zh, new_en) == want
