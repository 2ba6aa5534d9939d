"""The language of what labutils writes into a notebook: checker messages, ``versus``' words,
panel labels, machine reports. ``lu.set_language("zh")`` is the first code cell of every
Chinese notebook; English is the default, and its text is the literal in the code.

``tr("expected {e}, got {g}", e=1, g=2)`` returns the template, or its Chinese version from
``core/_zh.py``, formatted with ``str.format``; both versions use the same placeholder names
(a test checks, and that every literal passed to ``tr`` has a Chinese version). Numbers, code
and API names are values or stay as they are in both languages.

The language is a setting of this process. Ranks fork from a forkserver that started earlier,
so they do not see a later ``set_language``: code that composes a message on the ranks passes
``language()`` to them and calls ``set_language`` there (``exercises.base.run_check`` does).
"""
from __future__ import annotations

from labutils.core._zh import MESSAGES as _ZH

LANGUAGES = ("en", "zh")
_CATALOGS = {"en": {}, "zh": _ZH}
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


def tr(template, **values):
    """``template`` (English) in the current language, formatted with ``values``. A template
    without a translation falls back to English (the catalog test keeps that from happening)."""
    return _CATALOGS[_current].get(template, template).format(**values)
