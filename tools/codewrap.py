"""Wrap the code lines of the labs' code cells at 90 characters, for a projector and a laptop.

    python tools/codewrap.py check [LAB ...]   # list the code lines longer than 90; exit 1 if any
    python tools/codewrap.py apply [LAB ...]   # wrap notebooks/<lab>.ipynb and its zh catalog

then ``python tools/zh_catalog.py build LAB`` writes the Chinese notebook (no execution needed).

Why not black: black adds tokens (a trailing comma when it explodes a call, parentheses around
a long right-hand side), and the Chinese edition keeps a cell's stored outputs only while its
tokens, comments and line breaks aside, stay the same (tools/zh_code.py ``code_key``). So this
tool only moves text between lines, one long line at a time:
- a comment is split into several comment lines; a comment at a line's end that makes it too
  long moves onto its own line(s) above;
- code breaks inside brackets (after a comma, before ``for``/``if``/``and``/``or`` or a binary
  operator), the rest aligned under the bracket or indented 4 more;
- a long string literal becomes two adjacent literals (implicit concatenation, the same
  constant), the second aligned under the first; outside brackets a backslash continues.
Each cell's AST is compared before and after (``ast.dump``: adjacent literals are one constant
there), so the code means the same; a cell that would differ, or a line that cannot be broken,
is left as it was and reported. Outputs are never touched.

The Chinese catalog (translations/zh/<lab>.po): each code entry's msgid becomes the wrapped
English and its msgstr the Chinese wrapped by the same rules; the entry's flags (fuzzy or not)
and its ``#| msgid`` stay as they were, so a pure formatting change makes no cell fuzzy. A fuzzy
entry's msgstr stays as it is, paired with its ``#| msgid``: the build (tools/zh_build.py)
carries its Chinese onto the wrapped English (tools/zh_code.py ``carry_code`` matches a
comment or string split over lines) and wraps what it shows.
"""
from __future__ import annotations

import ast
import io
import json
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EN_DIR = ROOT / "notebooks"
LIMIT = 90
# Owned by other work in progress: wrapped by their authors, not by `apply` without names.
SKIP = ("06e_composed_parallelism", "07_conclusion_outlook")

_OPEN, _CLOSE = "([{", ")]}"
_KEYWORDS = {"for", "if", "else", "and", "or", "in"}
_BINARY = {"+", "-", "*", "/", "//", "%", "@", "==", "!=", "<=", ">=", "<", ">", "|", "&",
           "**", "^"}
_CJK_BREAK = "，。；：、）】》！？"


def _is_magic(line: str) -> bool:
    return line.lstrip().startswith(("%", "!"))


def _python(code: str) -> str:
    """The cell as Python: IPython magic and shell lines blanked (kept in place)."""
    return "".join("\n" if _is_magic(ln) else ln for ln in code.splitlines(keepends=True))


def _tree(code: str) -> str:
    """The AST of a cell with each docstring's whitespace collapsed (a re-wrapped docstring
    reads the same; every other string must stay the same character for character)."""
    tree = ast.parse(_python(code))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                body[0].value.value = " ".join(body[0].value.value.split())
    return ast.dump(tree)


def same_meaning(before: str, after: str) -> bool:
    """True when both parse to the same AST (adjacent string literals are one constant; a
    docstring's line breaks may move)."""
    try:
        return _tree(before) == _tree(after)
    except SyntaxError:
        return False


def _fix_docstring(lines: list[str], n: int, token, limit: int) -> str | None:
    """Line ``n`` of a triple-quoted string made shorter: the words past the limit move to the
    next line of its paragraph (or a new line), so only whitespace changes."""
    line = lines[n].rstrip("\n")
    cut = line.rfind(" ", 0, limit + 1)
    start = token.start[1] + 3 if token.start[0] == n + 1 else len(line) - len(line.lstrip())
    if cut <= start + 3:
        return None
    head, rest = line[:cut].rstrip(), line[cut + 1:].lstrip()
    if token.start[0] == n + 1:
        indent = " " * token.start[1]
    else:
        indent = line[: len(line) - len(line.lstrip())]
    last = token.end[0] == n + 1
    nxt = lines[n + 1].rstrip("\n") if not last and n + 1 < len(lines) else ""
    quotes = ('"' * 3, "'" * 3, "-", "*")
    if not last and nxt.strip() and not nxt.strip().startswith(quotes):
        merged = nxt[: len(nxt) - len(nxt.lstrip())] + rest + " " + nxt.lstrip()
        return "".join(lines[:n] + [head + "\n", merged + "\n"] + lines[n + 2:])
    return "".join(lines[:n] + [head + "\n", indent + rest + "\n"] + lines[n + 1:])


def long_lines(code: str, limit: int = LIMIT) -> list[str]:
    return [ln for ln in code.splitlines() if len(ln) > limit]


# -- comments ------------------------------------------------------------------------------------
def _split_text(text: str, width: int) -> list[str] | None:
    """``text`` in as few pieces of at most ``width`` characters as ``_greedy`` makes, of about
    equal length (no one-word last line)."""
    pieces = _greedy(text, width)
    if pieces is None or len(pieces) < 2:
        return pieces
    for w in range(max(1, len(text) // len(pieces)), width):
        even = _greedy(text, w)
        if even is not None and len(even) == len(pieces):
            return even
    return pieces


def _greedy(text: str, width: int) -> list[str] | None:
    """``text`` in pieces of at most ``width`` characters, broken at spaces (or, in Chinese,
    after punctuation, else between characters); None when a word is longer than ``width``."""
    def soft(k):  # a space or a Chinese punctuation mark before k
        a, b = rest[k - 1], rest[k] if k < len(rest) else " "
        return b == " " or a == " " or a in _CJK_BREAK

    def hard(k):  # between two Chinese characters
        a, b = rest[k - 1], rest[k] if k < len(rest) else " "
        return ord(a) > 0x2E7F and ord(b) > 0x2E7F and b not in _CJK_BREAK

    pieces, rest = [], text.strip()
    while len(rest) > width:
        cut = next((k for k in range(width, max(0, width - 15), -1) if soft(k)), -1)
        if cut < 0:
            cut = next((k for k in range(width, 0, -1) if soft(k) or hard(k)), -1)
        if cut <= 0:
            return None
        pieces.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    pieces.append(rest)
    return pieces


def _comment_lines(comment: str, indent: str, limit: int) -> list[str] | None:
    body = comment[1:].strip()
    pieces = _split_text(body, limit - len(indent) - 2)
    return None if pieces is None else [f"{indent}# {p}".rstrip() for p in pieces]


# -- one long line -------------------------------------------------------------------------------
def _tokens(code: str):
    return list(tokenize.generate_tokens(io.StringIO(_python(code)).readline))


def _string_split(body: str, prefix: str, room: int) -> int | None:
    """The best index to cut a string literal's body at, leaving at most ``room`` characters in
    the first piece (after a space, or in Chinese after a character); None when there is none."""
    ok = _cut_points(body, prefix)
    cuts = [k for k in range(1, min(room, len(body) - 1) + 1) if ok[k]]
    return cuts[-1] if cuts and cuts[-1] >= 8 else None


def _fix_line(code: str, n: int, limit: int, reflow: bool = True) -> str | None:
    """``code`` with its line ``n`` (0-based) made shorter, or None when this cannot."""
    lines = code.splitlines(keepends=True)
    line = lines[n].rstrip("\n")
    indent = line[: len(line) - len(line.lstrip())]
    toks = _tokens(code)
    on_line = [t for t in toks if t.start[0] == n + 1 and t.type not in (
        tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)]
    inside = [t for t in toks if t.type == tokenize.STRING and t.start[0] <= n + 1 <= t.end[0]
              and t.string.lstrip("rRbBuUfF")[:3] in ('"' * 3, "'" * 3)]
    if inside and (inside[0].start[0] < n + 1 or on_line[-1] is inside[0]):
        return _fix_docstring(lines, n, inside[0], limit)
    if not on_line or any(t.end[0] != n + 1 for t in on_line):
        return None  # a magic line, or a token that spans lines
    continued = n > 0 and lines[n - 1].rstrip("\n").endswith("\\")
    comment = on_line[-1] if on_line[-1].type == tokenize.COMMENT else None
    if comment is not None:
        if len(on_line) == 1:  # a comment line: several comment lines
            new = _comment_lines(comment.string, indent, limit)
        else:  # a comment at the end: onto its own line(s) above
            if continued:
                return None
            new = _comment_lines(comment.string, indent, limit)
            if new is not None:
                new.append(line[: comment.start[1]].rstrip())
        if new is None:
            return None
        return "".join(lines[:n] + [ln + "\n" for ln in new] + lines[n + 1:])

    # Bracket depth before each token of the line, and where each open bracket was opened.
    stack = []
    for t in toks:
        if t.start[0] > n + 1 or (t.start[0] == n + 1 and t is on_line[0]):
            break
        if t.type == tokenize.OP and t.string in _OPEN:
            stack.append(t)
        elif t.type == tokenize.OP and t.string in _CLOSE and stack:
            stack.pop()
    # Where the line may break: (tier, score, column, stack of brackets open there); the
    # best tier that fits wins (1: a comma or for/if/and/or inside brackets; 2: and/or/if/else
    # outside, with a backslash; 3: an operator or an opening bracket inside brackets; 4: any
    # operator outside).
    candidates = []
    prev, targets = None, set()  # depths inside a ``for`` target list (between for and in)
    for t in on_line:
        if t.type == tokenize.NAME and t.string == "for":
            targets.add(len(stack))
        elif t.type == tokenize.NAME and t.string == "in":
            targets.discard(len(stack))
        if prev is not None and not (t.type == tokenize.OP and t.string in _CLOSE):
            tier = score = None
            keyword = t.type == tokenize.NAME and t.string in _KEYWORDS
            if stack:
                if prev.type == tokenize.OP and prev.string == ",":
                    if len(stack) not in targets:
                        tier, score = 1, 3
                elif t.type == tokenize.STRING and prev.type == tokenize.STRING:
                    tier, score = 1, 3
                elif keyword and t.string != "in":
                    tier, score = 1, 2
                elif t.type == tokenize.OP and t.string in _BINARY:
                    tier, score = 3, 1
                elif (prev.type == tokenize.OP and prev.string in _OPEN
                      and not (prev.string == "[" and prev.start[1] > 0
                               and line[prev.start[1] - 1] not in " ([{,=")):
                    tier, score = 3, 1  # after an opening bracket (not a subscript's)
            elif not continued and keyword and t.string != "in":
                tier, score = 2, 0  # outside brackets: a backslash continues the line
            elif not continued and t.type == tokenize.OP and t.string in _BINARY:
                tier, score = 4, 0
            if tier is not None:
                candidates.append((tier, score, t.start[1], list(stack)))
        if t.type == tokenize.OP and t.string in _OPEN:
            stack.append(t)
        elif t.type == tokenize.OP and t.string in _CLOSE and stack:
            stack.pop()
        prev = t

    def broken(col: int, opened) -> str | None:
        first, rest = line[:col].rstrip(), line[col:].lstrip()
        if len(first) > limit or not first.strip():
            return None
        if opened:
            bracket = opened[-1]
            visual, hanging = " " * (bracket.start[1] + 1), indent + "    "
            if bracket.start[0] != n + 1:
                pad = indent
            elif len(visual) <= 60 or len(visual) + len(rest) <= limit:
                pad = visual
            else:
                pad = hanging
            return "".join(lines[:n] + [first + "\n", pad + rest + "\n"] + lines[n + 1:])
        if continued:
            return None
        return "".join(lines[:n] + [first + " \\\n", indent + "    " + rest + "\n"]
                       + lines[n + 1:])

    fitting = [c for c in candidates
               if len(line[: c[2]].rstrip()) <= limit - (2 if not c[3] else 0)]
    for tier in (1, 2, 3):
        good = [c for c in fitting if c[0] == tier and c[2] >= 0.45 * limit]
        if good:
            best = max(good, key=lambda c: (-len(c[3]), c[1], c[2]))  # outermost brackets first
            return broken(best[2], best[3])
    # A string literal across the limit: two adjacent literals.
    for t in reversed(on_line):
        if t.type != tokenize.STRING or t.start[1] > limit - 12:
            continue
        prefix, quote, body = _literal(t.string)
        if quote is None:
            continue
        room = limit - t.start[1] - len(prefix) - 2 - (0 if _open_at(toks, t) else 2)
        cut = _string_split(body, prefix, room)
        if cut is None:
            continue
        head = line[: t.start[1]] + prefix + quote + body[:cut] + quote
        tail = prefix + quote + body[cut:] + quote + line[t.end[1]:]
        if _open_at(toks, t):
            pad = " " * t.start[1] if t.start[1] <= 60 else indent + "    "
            merged = reflow and _merge_next(toks, t, lines, n, pad, prefix, quote, body[cut:],
                                            limit)
            if merged:
                return "".join(lines[:n] + [head + "\n", merged] + lines[n + 2:])
            return "".join(lines[:n] + [head + "\n", pad + tail + "\n"] + lines[n + 1:])
        if continued:
            continue
        return "".join(lines[:n] + [head + " \\\n", indent + "    " + tail + "\n"]
                       + lines[n + 1:])
    if fitting:
        best = max(fitting, key=lambda c: c[2])
        return broken(best[2], best[3])
    return None


def _merge_next(toks, t, lines, n, pad, prefix, quote, piece, limit=LIMIT):
    """The next line with ``piece`` (the cut-off end of string ``t``) joined to the literal that
    starts it, when that literal continues ``t`` (implicit concatenation, same quotes, aligned
    at ``pad``): a paragraph re-flows instead of leaving a short piece on a line of its own."""
    i = toks.index(t)
    if i + 2 >= len(toks) or toks[i + 1].type != tokenize.NL:
        return None
    nxt = toks[i + 2]
    if nxt.type != tokenize.STRING or nxt.start != (n + 2, len(pad)):
        return None
    p2, q2, b2 = _literal(nxt.string)
    if q2 != quote:
        return None
    f1, f2 = "f" in prefix.lower(), "f" in p2.lower()
    if prefix.lower().replace("f", "") != p2.lower().replace("f", ""):
        return None
    if f1 != f2 and ("{" in (piece if f1 else b2) or "}" in (piece if f1 else b2)):
        return None  # braces mean different things in the two literals
    new_prefix = prefix if f1 else p2
    line = lines[n + 1].rstrip("\n")
    merged = pad + new_prefix + quote + piece + b2 + quote + line[nxt.end[1]:]
    if len(merged) > limit:  # it will be cut again: only where the cut moves on past ``piece``
        cut = _string_split(piece + b2, new_prefix, limit - len(pad) - len(new_prefix) - 2)
        if cut is None or cut <= len(piece):
            return None
    return merged + "\n"


def _open_at(toks, target) -> list:
    stack = []
    for t in toks:
        if t is target:
            return stack
        if t.type == tokenize.OP and t.string in _OPEN:
            stack.append(t)
        elif t.type == tokenize.OP and t.string in _CLOSE and stack:
            stack.pop()
    return stack


def wrap(code: str, limit: int = LIMIT, reflow: bool = True) -> tuple[str, list[str]]:
    """(the wrapped cell, the lines still too long). A cell whose meaning would change is
    returned as it was. With ``reflow``, the cut-off end of a string joins the literal on the
    next line (a printed sentence re-flows instead of leaving a word on a line of its own)."""
    if not long_lines(code, limit):
        return code, []
    trailing = code.endswith("\n")
    text = code if trailing else code + "\n"
    try:
        _tokens(text)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return code, long_lines(code, limit)
    stuck: set[int] = set()
    for _ in range(400):
        todo = [i for i, ln in enumerate(text.splitlines()) if len(ln) > limit and i not in stuck]
        if not todo:
            break
        new = _fix_line(text, todo[0], limit, reflow)
        if new is None or not same_meaning(text, new):
            stuck.add(todo[0])
            continue
        # line numbers after the fixed line moved: recompute the stuck ones by content
        old_lines = text.splitlines()
        stuck_text = {old_lines[i] for i in stuck}
        text = new
        stuck = {i for i, ln in enumerate(text.splitlines()) if ln in stuck_text}
    if not trailing:
        text = text[:-1]
    if not same_meaning(code, text):
        return code, long_lines(code, limit)
    return text, long_lines(text, limit)


# -- a translation laid out as its English ---------------------------------------------------
def _texts(code: str):
    """The comments and string literals of a cell, in order (nbval markers included)."""
    return [t for t in _tokens(code) if t.type in (tokenize.COMMENT, tokenize.STRING)]


def _offsets(code: str):
    offsets = [0]
    for ln in code.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(ln))
    return lambda pos: offsets[pos[0] - 1] + pos[1]


def _adjacent(code: str, toks, at) -> list[list[int]]:
    """Groups of indices of ``toks``: runs of adjacent string literals (only blanks between),
    every comment on its own."""
    groups = []
    for i, t in enumerate(toks):
        if (groups and t.type == tokenize.STRING and toks[i - 1].type == tokenize.STRING
                and not code[at(toks[i - 1].end):at(t.start)].strip()):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _words(comments) -> str:
    return " ".join(" ".join(c.string[1:].split()) for c in comments)


def _fold(strings) -> str:
    return "".join(_literal(s.string)[2] for s in strings)


def _pieces(text: str, k: int, allowed) -> list[str] | None:
    """``text`` cut into exactly ``k`` pieces of about equal length at positions where
    ``allowed(i)``; None when there are too few such positions."""
    cuts, start = [], 0
    for n in range(1, k):
        goal = round(len(text) * n / k)
        options = [i for i in range(start + 1, len(text)) if allowed(i)]
        if len(options) < k - n:
            return None
        best = min(options[: len(options) - (k - n - 1)], key=lambda i: abs(i - goal))
        cuts.append(best)
        start = best
    bounds = [0] + cuts + [len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def _cut_points(body: str, prefix: str) -> list[bool]:
    """Where a literal's body may be cut into two literals of the same meaning: after a space,
    a Chinese character or punctuation, never inside an escape or an f-string field."""
    formatted, raw = "f" in prefix.lower(), "r" in prefix.lower()
    ok, depth, i = [False] * (len(body) + 1), 0, 0
    while i < len(body):
        ch = body[i]
        if formatted and body[i:i + 2] in ("{{", "}}") and depth == 0:
            i += 2
            ok[i] = True
            continue
        if ch == "\\" and not raw:
            i += 2
            continue
        if formatted and ch == "{":
            depth += 1
        elif formatted and ch == "}":
            depth -= 1
        i += 1
        if depth == 0 and i < len(body) and (ch == " " or ord(ch) > 0x2E7F or ch in ",;:)"):
            ok[i] = True
    return ok


def laid_out_as(en: str, en_wrapped: str, zh: str) -> str | None:
    """The translation ``zh`` of ``en`` with ``en_wrapped``'s layout: its code and line breaks,
    each comment wrapped over as many lines and each run of string literals cut into as many
    literals as the English now has, so the two keep pairing text for text
    (tools/zh_code.py ``carry_code``). None when the texts do not pair one to one. (Comments
    and strings are matched each in their own order: a comment moved above its line comes
    before that line's strings now.)"""
    try:
        o_t, z_t, w_t = _texts(en), _texts(zh), _texts(en_wrapped)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None
    if len(o_t) != len(z_t) or any(a.type != b.type for a, b in zip(o_t, z_t)):
        return None
    o_groups = _adjacent(en, o_t, _offsets(en))
    if o_groups != _adjacent(zh, z_t, _offsets(zh)):
        return None
    at, swaps = _offsets(en_wrapped), []  # (start, end, text) in en_wrapped
    w_c = [t for t in w_t if t.type == tokenize.COMMENT]
    w_s = [t for t in w_t if t.type == tokenize.STRING]
    jc = js = 0
    for group in o_groups:
        first = o_t[group[0]]
        if first.type == tokenize.COMMENT:
            want, k = _words([first]), 0
            while jc + k < len(w_c) and len(_words(w_c[jc:jc + k + 1])) <= len(want):
                k += 1
                if _words(w_c[jc:jc + k]) == want:
                    break
            if k == 0 or _words(w_c[jc:jc + k]) != want:
                return None
            body = " ".join(z_t[group[0]].string[1:].split())
            parts = [body] if k == 1 else _pieces(
                body, k, lambda i, b=body: b[i - 1] == " " or ord(b[i - 1]) > 0x2E7F
                or b[i - 1] in _CJK_BREAK)
            if parts is None:
                return None
            keep = k == 1 and z_t[group[0]].string  # a comment not re-wrapped stays as it was
            swaps += [(at(w.start), at(w.end), keep or "# " + p.strip())
                      for w, p in zip(w_c[jc:jc + k], parts)]
            jc += k
            continue
        if _literal(first.string)[1] is None:  # a docstring: its own line breaks (wrapped
            if js >= len(w_s):                 # on its own afterwards)
                return None
            swaps.append((at(w_s[js].start), at(w_s[js].end), z_t[group[0]].string))
            js += 1
            continue
        want, k = _fold([o_t[i] for i in group]), 0
        while js + k < len(w_s) and len(_fold(w_s[js:js + k + 1])) <= len(want):
            k += 1
            if _fold(w_s[js:js + k]) == want:
                break
        if k == 0 or _fold(w_s[js:js + k]) != want:
            return None
        zs = [z_t[i] for i in group]
        if k == len(zs):
            parts = [z.string for z in zs]
        else:
            lits = [_literal(z.string) for z in zs]
            if any(lit[1] is None or lit[:2] != lits[0][:2] for lit in lits):
                return None
            prefix, quote = lits[0][0], lits[0][1]
            body = "".join(lit[2] for lit in lits)
            ok = _cut_points(body, prefix)
            cut = _pieces(body, k, lambda i: ok[i])
            if cut is None:
                return None
            parts = [prefix + quote + p + quote for p in cut]
        swaps += [(at(w.start), at(w.end), p) for w, p in zip(w_s[js:js + k], parts)]
        js += k
    if jc != len(w_c) or js != len(w_s):
        return None
    out, pos = [], 0
    for start, end, text in sorted(swaps):
        out += [en_wrapped[pos:start], text]
        pos = end
    out.append(en_wrapped[pos:])
    text = "".join(out)
    if text.endswith("\n") != zh.endswith("\n"):  # the translation's own end of cell
        text = text + "\n" if zh.endswith("\n") else text.rstrip("\n")
    return text if same_meaning(zh, text) else None


def _literal(text: str):
    """(prefix, quote, body) of a string literal; quote None for a triple-quoted one."""
    m = re.match(r"([A-Za-z]*)('|\")", text)
    if m is None or text.startswith(m.group(2) * 3, len(m.group(1))):
        return m.group(1) if m else "", None, ""
    return m.group(1), m.group(2), text[len(m.group(1)) + 1: -1]


def wrap_translation(en: str, en_wrapped: str, zh: str, limit: int = LIMIT):
    """(the Chinese code wrapped, its lines still too long): laid out as the English where the
    texts pair (``laid_out_as``), then any Chinese line still too long wrapped on its own."""
    if en_wrapped == en and not long_lines(zh, limit):
        return zh, []
    paired = laid_out_as(en, en_wrapped, zh)
    return wrap(paired if paired is not None else zh, limit)


# -- notebooks and catalogs ----------------------------------------------------------------------
def _source(cell) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def _write_notebook(path: Path, nb: dict) -> None:
    text = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"  # as nbformat
    path.write_text(text, encoding="utf-8")


def _keeps_fuzzy_build(entry, reflowed: str, plain: str) -> bool:
    """True when a fuzzy entry's Chinese build shows the same code on ``reflowed`` as on
    ``plain`` (its old Chinese carried where it applies): a re-flow that moves the cuts between
    literals would leave the old translation of a literal nowhere to go."""
    import zh_build
    import zh_code

    def shown(src):
        return zh_code.code_key(zh_build.cell_text({"cell_type": "code", "source": src}, entry))
    return shown(reflowed) == shown(plain)


def apply(lab: str, limit: int = LIMIT) -> list[str]:
    """Wrap the English notebook and the code entries of its Chinese catalog; the lines left
    too long, one per line of the report."""
    import polib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    left = []
    path = EN_DIR / f"{lab}.ipynb"
    nb = json.loads(path.read_text(encoding="utf-8"))
    po_path = ROOT / "translations" / "zh" / f"{lab}.po"
    po = polib.pofile(str(po_path), wrapwidth=0) if po_path.exists() else []
    entries = {e.msgctxt: e for e in po if not e.obsolete and e.comment == "code"}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src, entry = _source(cell), entries.get(cell.get("id"))
        new, rest = wrap(src, limit)
        if entry is not None and "fuzzy" in entry.flags and entry.msgstr:
            plain, rest_plain = wrap(src, limit, reflow=False)
            if not _keeps_fuzzy_build(entry, new, plain):
                new, rest = plain, rest_plain
        left += [f"{lab} {cell.get('id')}: {ln.strip()[:60]}" for ln in rest]
        if new != src:
            cell["source"] = new.splitlines(keepends=True)
        if entry is not None and entry.msgid == src:
            entry.msgid = new
            if entry.msgstr and "fuzzy" not in entry.flags:
                # (a fuzzy entry's Chinese translates its ``#| msgid`` and stays paired with
                # it; the build carries it onto the wrapped English and wraps the result)
                entry.msgstr, rest_zh = wrap_translation(src, new, entry.msgstr, limit)
                left += [f"{lab} {entry.msgctxt} (zh): {ln.strip()[:60]}" for ln in rest_zh]
    _write_notebook(path, nb)
    if po_path.exists():
        text = str(po) + "\n"
        if po_path.read_text(encoding="utf-8") != text:
            po_path.write_text(text, encoding="utf-8")
    return left


def check(paths: list[Path], limit: int = LIMIT) -> list[str]:
    found = []
    for path in paths:
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                found += [f"{path.relative_to(ROOT)} {cell.get('id')}: {len(ln)} characters"
                          for ln in long_lines(_source(cell), limit)]
    return found


def main(argv: list[str]) -> int | str:
    command, names = (argv[0], argv[1:]) if argv else ("", [])
    labs = names or [p.stem for p in sorted(EN_DIR.glob("*.ipynb"))]
    if command == "check":
        paths = [EN_DIR / f"{lab}.ipynb" for lab in labs]
        paths += [p for p in (EN_DIR / "zh" / f"{lab}.ipynb" for lab in labs) if p.exists()]
        found = check(paths)
        print("\n".join(found + [f"{len(found)} code line(s) longer than {LIMIT}"]))
        return 1 if found else 0
    if command == "apply":
        left = []
        for lab in labs if names else [lab for lab in labs if lab not in SKIP]:
            left += apply(lab)
        print("\n".join(left + [f"{len(left)} line(s) left longer than {LIMIT}"]))
        return 1 if left else 0
    return __doc__


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
