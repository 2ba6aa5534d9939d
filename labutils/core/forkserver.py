"""The forkserver every rank forks from: started once, it imports torch and the course's rank
modules (named by the face through ``set_preload``), so a warm launch costs a ``fork()``."""
from __future__ import annotations

import multiprocessing as mp
import os

_PRELOAD = ()   # the course's modules that ranks use; set by the package face (set_preload)


def set_preload(modules):
    """Modules the forkserver imports once, besides torch (see ``core/_preload.py``). The
    launcher knows no lesson: the face passes the course map's list in."""
    global _PRELOAD
    _PRELOAD = tuple(modules)


def _context():
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":
        # Imported once by the forkserver, then inherited by every fork: the warm path. The
        # forkserver is a fresh interpreter; the module list reaches it in its environment.
        os.environ["LABUTILS_PRELOAD"] = ",".join(_PRELOAD)
        ctx.set_forkserver_preload(["labutils.core._preload"])
    return ctx


_CTX = None


def warmup():
    """Start the forkserver now (it imports torch once) so the first launch is fast too."""
    global _CTX
    if _CTX is None:
        _CTX = _context()
        if _CTX.get_start_method() == "forkserver":
            from multiprocessing import forkserver
            forkserver.ensure_running()
    return _CTX
