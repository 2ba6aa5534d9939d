"""The language of what labutils writes into a notebook: checker messages, ``versus``' words,
panel labels, machine reports. ``lu.set_language("zh")`` is the first code cell of every
Chinese notebook; English is the default, and its text is the literal in the code.

``tr("expected {e}, got {g}", e=1, g=2)`` returns the template, or its Chinese version, formatted
with ``str.format``; both versions use the same placeholder names. The Chinese lives beside the
code that prints it: ``labutils/<package>/locale/zh.po``, gettext catalogs that
tools/zh_messages.py extracts from the ``tr`` calls (tests/test_i18n.py checks that every
literal passed to ``tr`` has a translation with the same placeholders). They are read here with
polib, once, at import: no compiled .mo to keep in step with the .po, and the ranks, forked from
a forkserver that imported core, inherit the table. As in gettext, a fuzzy or untranslated
entry falls back to the English. Numbers, code and API names stay as they are in both languages.

Data that a table shows (a variant's name, a link's note) stays English where it is a key; it is
marked ``N_("one bucket")`` where it is defined, and ``label(name)`` shows it in the current
language (catalog context "label").

The language is a setting of this process. Ranks fork from a forkserver that started earlier,
so they do not see a later ``set_language``: code that composes a message on the ranks passes
``language()`` to them and calls ``set_language`` there (``exercises.base.run_check`` does).
"""
from __future__ import annotations

from pathlib import Path

import polib

LANGUAGES = ("en", "zh")
LABEL = "label"  # the catalogs' msgctxt of data labels (N_)
_PACKAGE = Path(__file__).resolve().parent.parent


def _load(language):
    """{(msgctxt, English): translation} of every translated entry of labutils' catalogs."""
    paths = sorted(_PACKAGE.glob(f"*/locale/{language}.po")) + [
        _PACKAGE / "locale" / f"{language}.po"]
    return {(e.msgctxt, e.msgid): e.msgstr for path in paths if path.exists()
            for e in polib.pofile(str(path)) if e.translated()}  # not fuzzy, not obsolete


_CATALOGS = {"en": {}, "zh": _load("zh")}
_current = "en"


def set_language(lang):
    """Write labutils' sentences in ``lang``: "en" (the default) or "zh" (简体中文)."""
    global _current
    if lang not in LANGUAGES:
        raise ValueError(f"unknown language {lang!r}; the choices are "
                         f"{', '.join(repr(x) for x in LANGUAGES)}")
    _current = lang


def language():
    """The language set by :func:`set_language` ("en" unless changed)."""
    return _current


def translate(text, language=None, context=None):
    """``text`` in ``language`` (default: the current one), unformatted; ``context`` is the
    catalog's msgctxt (the course map's text has one). English when there is no translation."""
    return _CATALOGS[language or _current].get((context, text), text)


def N_(text):
    """Marks ``text``, a data label defined here (a variant's name, a note), for the catalogs;
    returns it unchanged, so the English stays the key the code looks it up by."""
    return text


def label(text):
    """A data label marked with :func:`N_` where it is defined, in the current language."""
    return translate(text, context=LABEL)


def tr(template, **values):
    """``template`` (English) in the current language, formatted with ``values``. A template
    without a translation falls back to English (the catalog test keeps that from happening)."""
    return translate(template).format(**values)
