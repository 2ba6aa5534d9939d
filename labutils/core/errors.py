"""Errors of a launch, each saying which rank and why (raised in the caller)."""
from __future__ import annotations


class WorkerError(RuntimeError):
    """A rank raised or died. ``str(e)`` starts with ``rank N: ExcType: message``."""

    def __init__(self, message, rank=None, exitcode=None, remote_traceback=""):
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.remote_traceback = remote_traceback


class LaunchTimeout(TimeoutError, WorkerError):
    """The launch ran past ``timeout``; ``.stacks`` maps each stuck rank to its Python stack,
    ``.stuck`` lists one line per stuck rank ("rank 1 waiting in dist.recv, line 7 of f", in
    the notebook's language), so callers can quote them without parsing the message."""

    def __init__(self, message, rank=None, stacks=None, stuck=()):
        WorkerError.__init__(self, message, rank=rank,
                             remote_traceback="\n".join((stacks or {}).values()))
        self.stacks = stacks or {}
        self.stuck = tuple(stuck)


class LaunchStopped(WorkerError):
    """The launch was ended from outside: ``stop_all()``, a panel's Stop button, or the
    kernel's interrupt (JupyterLab's Stop) while a panel runs."""


STOPPED = "stopped: every rank was ended"


class LaunchInterrupted(KeyboardInterrupt):
    """A launch in a notebook cell was interrupted (JupyterLab's Stop, Ctrl-C); every rank
    was ended. Shown as one line in a notebook (see ``labutils.__init__``)."""
