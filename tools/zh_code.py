"""What a translation may change in a code cell, by Python's own tokenizer (tools/zh_catalog.py).

A translated code cell is the English code with only its comments and string literals changed,
token for token, so the Chinese edition runs the English code. ``carry_code`` moves the Chinese
comments and strings of an old translation onto reformatted English code when the English
comments and strings are unchanged and in the same order; ``code_key`` is what a cell's outputs
depend on (its code and strings, not its comments), so a comment-only change keeps the outputs.
Both see adjacent string literals as one (implicit concatenation) and a docstring's line breaks
as spaces, so a cell re-wrapped at 90 characters (tools/codewrap.py) keeps its outputs and its
translation.
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


def _literal_parts(text: str):
    """(prefix, quote, body) of a string literal, its prefix lower-cased and without a no-op
    ``f`` (no braces) or ``u``."""
    m = re.match(r"([A-Za-z]*)('{3}|\"{3}|'|\")", text)
    prefix, quote = m.group(1).lower().replace("u", ""), m.group(2)
    body = text[len(m.group(0)): len(text) - len(quote)]
    if "f" in prefix and "{" not in body and "}" not in body:
        prefix = prefix.replace("f", "")
    return prefix, quote, body


def _joinable(a, b) -> bool:
    """True when literals ``a`` and ``b`` read as one: the same quotes and prefix, or one an
    f-string and the other plain without braces."""
    if a[1] != b[1] or a[0].replace("f", "") != b[0].replace("f", ""):
        return False
    plain = [p for p in (a, b) if "f" not in p[0]]
    return len(plain) != 1 or not ("{" in plain[0][2] or "}" in plain[0][2])


def _folded(toks):
    """Tokens with adjacent string literals (implicit concatenation, across line breaks and
    comments) folded into one, and each docstring's whitespace collapsed: the same code, as
    a line-wrapping tool (tools/codewrap.py) may lay it out."""
    out, i = [], 0
    while i < len(toks):
        t = toks[i]
        if t.type != tokenize.STRING:
            out.append(t)
            i += 1
            continue
        parts, j = [], i
        while j < len(toks) and toks[j].type in (tokenize.STRING, tokenize.NL, tokenize.COMMENT):
            if toks[j].type == tokenize.STRING:
                part = _literal_parts(toks[j].string)
                if parts and _joinable(parts[-1], part):
                    prefix = parts[-1][0] if "f" in parts[-1][0] else part[0]
                    parts[-1] = (prefix, part[1], parts[-1][2] + part[2])
                else:
                    parts.append(part)
            j += 1
        while toks[j - 1].type != tokenize.STRING:
            j -= 1  # line breaks and comments after the last literal stay
        if (len(parts) == 1 and i > 0 and toks[i - 1].type == tokenize.INDENT
                and j < len(toks) and toks[j].type == tokenize.NEWLINE):
            parts = [(*parts[0][:2], " ".join(parts[0][2].split()))]  # a docstring
        out.append(tokenize.TokenInfo(tokenize.STRING, repr(tuple(parts)), t.start,
                                      toks[j - 1].end, t.line))
        i = j
    return out


def code_difference(en: str, zh: str) -> str | None:
    """None when ``zh`` is ``en`` with only comments and string literals changed, else a line
    that says where they differ."""
    try:
        m_en, t_en = _tokens(en)
        m_zh, t_zh = _tokens(zh)
        t_en, t_zh = _folded(t_en), _folded(t_zh)
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
    return tuple(magic), tuple((t.type, t.string) for t in _folded(toks)
                               if t.type not in (tokenize.COMMENT, tokenize.NL))


def _texts(code: str):
    """The comments and string literals of a cell, in order, with their token positions."""
    _, toks = _tokens(code)
    return [t for t in toks if t.type in (tokenize.COMMENT, tokenize.STRING)
            and not (t.type == tokenize.COMMENT and _NBVAL.match(t.string))]


def _fold_parts(tokens) -> tuple:
    """Adjacent string literals as one: their (prefix, quote, body) parts, joinable ones joined."""
    parts = []
    for t in tokens:
        part = _literal_parts(t.string)
        if parts and _joinable(parts[-1], part):
            prefix = parts[-1][0] if "f" in parts[-1][0] else part[0]
            parts[-1] = (prefix, part[1], parts[-1][2] + part[2])
        else:
            parts.append(part)
    return tuple(parts)


def _index(code: str):
    """A function from a token's (line, column) to its index in ``code``."""
    offsets = [0]
    for ln in code.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(ln))
    return lambda pos: offsets[pos[0] - 1] + pos[1]


def _runs(code: str, toks) -> list[tuple[int, int]]:
    """Index ranges [a, b] of ``toks`` that are adjacent string literals (only blanks between)."""
    at = _index(code)
    runs, a = [], None
    for i, t in enumerate(toks):
        if t.type != tokenize.STRING:
            a = None
            continue
        if a is not None and not code[at(toks[i - 1].end):at(t.start)].strip():
            runs[-1] = (a, i)
        else:
            a = i
            runs.append((i, i))
    return runs


def _span(code: str, first, last) -> str:
    at = _index(code)
    return code[at(first.start):at(last.end)]


def carry_code(old_en: str, old_zh: str, new_en: str, partial: bool = False) -> str | None:
    """``new_en`` with each comment and string replaced by the Chinese that stood for the same
    English text in ``old_zh``. None when a comment or string of ``new_en`` is new, or when the
    old translation does not pair its texts one to one with ``old_en``; with ``partial``, a new
    text stays English instead (a fuzzy cell's best build: the English code, the old Chinese
    wherever it still applies). A comment that ``new_en`` wraps over several lines, or a string
    it splits into adjacent literals, takes the Chinese of the one it was (on one line)."""
    try:
        en_t, zh_t, new_t = _texts(old_en), _texts(old_zh), _texts(new_en)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None
    if len(en_t) != len(zh_t):
        return None
    table, wrapped = {}, {}
    for e, z in zip(en_t, zh_t):
        if table.setdefault((e.type, e.string), z.string) != z.string:
            return None  # one English text translated two ways: keep it for a human
        if e.type == z.type == tokenize.COMMENT:
            wrapped.setdefault(("comment", " ".join(e.string[1:].split())), z.string)
        elif e.type == z.type == tokenize.STRING:
            wrapped.setdefault(("string", _fold_parts([e])), z.string)
    zh_runs = set(_runs(old_zh, zh_t))
    for a, b in _runs(old_en, en_t):  # a string, or adjacent ones: their Chinese as one piece
        if (a, b) in zh_runs:
            wrapped.setdefault(("string", _fold_parts(en_t[a:b + 1])),
                               _span(old_zh, zh_t[a], zh_t[b]))
    at = _index(new_en)
    out, pos, i = [], 0, 0
    while i < len(new_t):
        t = new_t[i]
        key, end, chinese = (t.type, t.string), i, None
        if key in table:
            chinese = table[key]
        else:  # the pieces of a wrapped comment or a split string
            joined = []
            for j in range(i, len(new_t)):
                u = new_t[j]
                between = new_en[at(new_t[j - 1].end):at(u.start)] if j > i else ""
                if u.type != t.type or between.strip() or (
                        t.type == tokenize.COMMENT and j > i and "\n" not in between):
                    break
                joined.append(u)
                if t.type == tokenize.COMMENT:
                    norm = ("comment", " ".join(" ".join(v.string[1:].split()) for v in joined))
                else:
                    norm = ("string", _fold_parts(joined))
                if norm in wrapped and (j > i or t.type == tokenize.STRING):
                    chinese, end = wrapped[norm], j
                    break
        if chinese is None:
            if partial:
                i += 1
                continue
            return None
        out += [new_en[pos:at(t.start)], chinese]
        pos = at(new_t[end].end)
        i = end + 1
    out.append(new_en[pos:])
    return "".join(out)

