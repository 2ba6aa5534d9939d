"""labutils: the tested library behind the labs. ``import labutils as lu``.

This file is the face: it maps the short names notebooks write to the layer modules behind
them, and nothing else. ``lu.ddp`` is ``labutils.parallel.ddp``, ``lu.planner`` is
``labutils.cost.planner``; ``lu.check_<name>`` is the exercise checker the course map
(``labutils.course``) registers under that name. Modules load on first use, so
``import labutils`` is quick and one lab's module never slows another lab down. The layers are
described in ARCHITECTURE.md.
"""
import importlib
import inspect

from labutils import course
from labutils.core import forkserver as _forkserver
from labutils.core.errors import (
    LaunchInterrupted,
    LaunchStopped,
    LaunchTimeout,
    WorkerError,
)
from labutils.core import i18n as _i18n
from labutils.core.i18n import label, language
from labutils.core.job import stop_all
from labutils.core.launcher import launch
from labutils.core.rank import progress


def set_language(lang):
    """Write labutils' sentences in ``lang``: "en" (the default) or "zh" (简体中文); for "zh",
    figures also draw Chinese text (a Chinese font after DejaVu Sans, viz/style.py)."""
    _i18n.set_language(lang)
    if lang == "zh":
        from labutils.viz import style
        style.use_chinese_font()


__version__ = "0.2.0"
__all__ = ["LaunchInterrupted", "LaunchStopped", "LaunchTimeout", "WorkerError", "launch",
           "stop_all", "progress", "show_source", "show_solution", "course", "set_language",
           "language", "label"]

# Ranks fork from a server that has imported the modules of the lower layers once.
_forkserver.set_preload(course.rank_modules())


def _show_interrupted(shell, etype, value, tb, tb_offset=None):
    """In a notebook, an interrupted launch is one line (every rank was ended; the frames
    inside the launcher would only hide that). IPython ignores what a custom handler returns
    when it runs user code, so the handler shows the error itself."""
    stb = [f"KeyboardInterrupt: {value}"]
    shell._showtraceback(etype, value, stb)
    return stb


def _set_up_notebook():
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "set_custom_exc"):
        shell.set_custom_exc((LaunchInterrupted,), _show_interrupted)
    if shell is not None:   # a notebook: figures sized for a projector (viz/style.py)
        from labutils.viz import style
        style.use_projector_style()


_set_up_notebook()


def show_source(obj):
    """Print the source of a labutils function or class: the lesson's lines, in the page."""
    print(inspect.getsource(obj))


def _exercise_module(name):
    path = course.checker_module(name)
    if path is None:
        raise AttributeError(f"labutils has no exercise checker 'check_{name}'; the exercises "
                             f"are: {', '.join('check_' + n for n in course.checkers())}")
    return importlib.import_module(path)


def show_solution(name):
    """Print the tested reference solution of exercise ``name`` (for teachers)."""
    module = _exercise_module(name)
    if not hasattr(module, name):
        raise KeyError(f"no reference solution called {name!r} in {module.__name__}")
    show_source(getattr(module, name))


def __getattr__(name):
    if name.startswith("check_"):
        return getattr(_exercise_module(name[len("check_"):]), name)
    if name in course.MODULES:
        return importlib.import_module(course.MODULES[name])
    if name in course.LAYERS:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'labutils' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(course.MODULES) | set(course.LAYERS)
                  | {"check_" + n for n in course.checkers()})
