"""What a translation may change in a code cell, by Python's own tokenizer (tools/zh_catalog.py).

A translated code cell is the English code with only its comments and string literals changed,
token for token, so the Chinese edition runs the English code. ``carry_code`` moves the Chinese
comments and strings of an old translation onto reformatted English code when the English
comments and strings are unchanged and in the same order; ``code_key`` is what a cell's outputs
depend on (its code and strings, not its comments), so a comment-only change keeps the outputs.
"""
from __future__ import annotations

import io
import re
import tokenize

_SENTENCE = re.compile(r"[A-Za-z]{2,}[ ,:;.()'-]+[A-Za-z]{2,}")
_NBVAL = re.compile(r"^#\s*NBVAL_")
_STRUCTURE = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)


def source(cell) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def _is_magic(line: str) -> bool:
    return line.lstrip().startswith(("%", "!"))


def _tokens(code: str):
    """Python tokens of a cell, with IPython magic and shell lines kept as opaque lines."""
    lines = code.splitlines(keepends=True)
    magic = [ln for ln in lines if _is_magic(ln)]
    plain = "".join("\n" if _is_magic(ln) else ln for ln in lines)
    toks = list(tokenize.generate_tokens(io.StringIO(plain).readline))
    return magic, toks


def translatable(code: str) -> bool:
    """True when a code cell has a comment or a sentence in a string that a reader sees."""
    _, toks = _tokens(code)
    for t in toks:
        if t.type == tokenize.COMMENT and not _NBVAL.match(t.string):
            return True
        if t.type == tokenize.STRING and _SENTENCE.search(t.string):
            return True
    return False


def needs_entry(cell) -> bool:
    """Every markdown cell with text, and every code cell with something to translate."""
    if not source(cell).strip():
        return False  # gettext reserves the empty msgid for the catalog's header
    return cell["cell_type"] == "markdown" or (
        cell["cell_type"] == "code" and translatable(source(cell)))


def code_difference(en: str, zh: str) -> str | None:
    """None when ``zh`` is ``en`` with only comments and string literals changed, else a line
    that says where they differ."""
    try:
        m_en, t_en = _tokens(en)
        m_zh, t_zh = _tokens(zh)
    except (tokenize.TokenError, SyntaxError, IndentationError) as exc:
        return f"the translated code does not tokenize: {exc}"
    if m_en != m_zh:
        return "a magic or shell line (% or !) differs"
    skip = {tokenize.COMMENT, tokenize.STRING, tokenize.NL, tokenize.ENDMARKER, *_STRUCTURE}
    a = [(t.type, t.string) for t in t_en if t.type not in skip]
    b = [(t.type, t.string) for t in t_zh if t.type not in skip]
    # Statement structure must match too: the same NEWLINE/INDENT/DEDENT sequence.
    sa = [t.type for t in t_en if t.type in _STRUCTURE]
    sb = [t.type for t in t_zh if t.type in _STRUCTURE]
    na = sum(t.type == tokenize.STRING for t in t_en)
    nb = sum(t.type == tokenize.STRING for t in t_zh)
    if a != b or sa != sb or na != nb:
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"code differs from the English at token {i}: {x[1]!r} vs {y[1]!r}"
        return "code differs from the English (a statement or string added or removed)"
    return None


def code_key(code: str):
    """What a code cell's outputs depend on: its tokens without comments and line breaks inside
    statements (strings kept: a translated string may be printed). Code that does not tokenize
    is its own key."""
    try:
        magic, toks = _tokens(code)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return code
    return tuple(magic), tuple((t.type, t.string) for t in toks
                               if t.type not in (tokenize.COMMENT, tokenize.NL))


def _texts(code: str):
    """The comments and string literals of a cell, in order, with their token positions."""
    _, toks = _tokens(code)
    return [t for t in toks if t.type in (tokenize.COMMENT, tokenize.STRING)
            and not (t.type == tokenize.COMMENT and _NBVAL.match(t.string))]


def carry_code(old_en: str, old_zh: str, new_en: str, partial: bool = False) -> str | None:
    """``new_en`` with each comment and string replaced by the Chinese that stood for the same
    English text in ``old_zh``. None when a comment or string of ``new_en`` is new, or when the
    old translation does not pair its texts one to one with ``old_en``; with ``partial``, a new
    text stays English instead (a fuzzy cell's best build: the English code, the old Chinese
    wherever it still applies)."""
    try:
        en_t, zh_t, new_t = _texts(old_en), _texts(old_zh), _texts(new_en)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None
    if len(en_t) != len(zh_t):
        return None
    table = {}
    for e, z in zip(en_t, zh_t):
        if table.setdefault((e.type, e.string), z.string) != z.string:
            return None  # one English text translated two ways: keep it for a human
    lines = new_en.splitlines(keepends=True)
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln))
    out, pos = [], 0
    for t in new_t:
        key = (t.type, t.string)
        if key not in table:
            if partial:
                continue
            return None
        start = offsets[t.start[0] - 1] + t.start[1]
        end = offsets[t.end[0] - 1] + t.end[1]
        out += [new_en[pos:start], table[key]]
        pos = end
    out.append(new_en[pos:])
    return "".join(out)
