"""labutils: the tested library behind the labs. ``import labutils as lu``.

Lesson code stays in the notebooks; processes, timing, data and plots come from here.
Submodules load on first use (``lu.ddp``, ``lu.pipeline``, ...), so ``import labutils`` is
quick and one lab's module never slows another lab down.
"""
import importlib
import inspect

from .launcher import (LaunchInterrupted, LaunchStopped, LaunchTimeout, WorkerError, launch,
                       progress, stop_all)

__version__ = "0.1.0"

# Modules searched for ``lu.check_<name>`` exercise checkers and ``lu.show_solution(name)``.
_LAB_MODULES = ("launcher", "collectives", "async_sgd", "costmodel", "data", "models", "train",
                "workloads", "memory", "ddp", "checkpoint", "shm_allreduce", "bench",
                "model_parallel", "pipeline", "tensor_parallel", "sharding", "planner",
                "sync_batchnorm", "exercises")


def _show_interrupted(shell, etype, value, tb, tb_offset=None):
    """In a notebook, an interrupted launch is one line (every rank was ended; the frames
    inside the launcher would only hide that). IPython ignores what a custom handler returns
    when it runs user code, so the handler shows the error itself."""
    stb = [f"KeyboardInterrupt: {value}"]
    shell._showtraceback(etype, value, stb)
    return stb


def _register_interrupt_display():
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "set_custom_exc"):
        shell.set_custom_exc((LaunchInterrupted,), _show_interrupted)


_register_interrupt_display()


def show_source(obj):
    """Print the source of a labutils function or class: the lesson's lines, in the page."""
    print(inspect.getsource(obj))


def _find(name):
    for mod in _LAB_MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{mod}":
                raise
            continue
        if hasattr(module, name):
            return getattr(module, name)
    return None


def show_solution(name):
    """Print the tested reference solution of exercise ``name`` (for teachers)."""
    obj = _find(name)
    if obj is None:
        raise KeyError(f"no reference solution called {name!r}")
    show_source(obj)


def __getattr__(name):
    if name.startswith("check_"):
        checker = _find(name)
        if checker is not None:
            return checker
        raise AttributeError(f"labutils has no exercise checker {name!r}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"{__name__}.{name}":
            raise AttributeError(f"module 'labutils' has no attribute {name!r}") from None
        raise
