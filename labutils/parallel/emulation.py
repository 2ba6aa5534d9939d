"""Emulated links: each collective takes the time the alpha-beta model gives for a link.

Used by 04c (section 6, through ``lu.emulated_ddp``) and 07.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time

from labutils.cost.costmodel import _check, collective_time, get_link

# ---- emulated links: each collective takes the time the model gives for the link ---------
#
# Emulation runs the real collective (results unchanged), then waits out the difference to the
# time the alpha-beta model gives on the chosen link. So it can show a link slower than this
# machine's own all-reduce, never a faster one (04c2 prints which of the two binds). Like a
# real link, it carries one collective at a time: each one starts when the previous has
# finished (``_LinkClock``).

class _LinkClock:
    """When this process's emulated link is next free (collectives on it are serial)."""

    def __init__(self):
        self.free_at = 0.0
        self.lock = threading.Lock()

    def reserve(self, seconds, issued):
        with self.lock:
            self.free_at = max(issued, self.free_at) + seconds
            return self.free_at


_SPIN_S = 300e-6  # sleep() overshoots by 0.1-0.3 ms here: sleep short of the deadline, then spin


def _wait_until(deadline):
    while (left := deadline - time.perf_counter()) > _SPIN_S:
        time.sleep(left - _SPIN_S)
    while time.perf_counter() < deadline:
        pass


def _nbytes(t):
    return t.numel() * t.element_size()


# collective -> (model op, bytes that op moves, from its bound arguments)
_PATCHED = {
    "all_reduce": ("allreduce", lambda a: _nbytes(a["tensor"])),
    "broadcast": ("broadcast", lambda a: _nbytes(a["tensor"])),
    "reduce_scatter_tensor": ("reduce_scatter", lambda a: _nbytes(a["input"])),
    "all_gather_into_tensor": ("all_gather", lambda a: _nbytes(a["output_tensor"])),
    "all_gather": ("all_gather", lambda a: sum(_nbytes(t) for t in a["tensor_list"])),
    "reduce_scatter": ("reduce_scatter", lambda a: sum(_nbytes(t) for t in a["input_list"])),
    "send": ("send_recv", lambda a: _nbytes(a["tensor"])),
    "recv": ("send_recv", lambda a: _nbytes(a["tensor"])),
    "isend": ("send_recv", lambda a: _nbytes(a["tensor"])),
    "irecv": ("send_recv", lambda a: _nbytes(a["tensor"])),
}


class _EmulatedWork:
    """An async handle whose ``wait()`` also waits for the emulated link."""

    def __init__(self, work, finish):
        self.work, self.finish = work, finish

    def wait(self, *args, **kwargs):
        out = self.work.wait(*args, **kwargs)
        _wait_until(self.finish)
        return out

    def is_completed(self):
        return self.work.is_completed() and time.perf_counter() >= self.finish

    def get_future(self):
        finish = self.finish
        return self.work.get_future().then(lambda f: (_wait_until(finish), f.value())[1])

    def __getattr__(self, name):
        return getattr(self.work, name)


@functools.lru_cache(maxsize=None)
def _signature(fn):
    """``inspect.signature`` of a collective, computed once (entering ``emulate`` is cheap)."""
    return inspect.signature(fn)


class emulate(contextlib.ContextDecorator):
    """Inside a rank: ``with lu.emulation.emulate("10GbE"):`` slows every ``dist.<collective>``
    (all_reduce, broadcast, reduce_scatter(_tensor), all_gather(_into_tensor), send/recv,
    isend/irecv) to the time the model gives on ``link``; results are unchanged.

    ``link``: a name in ``LINKS``, a ``Link``, or a fitted ``(alpha, beta)``. Code must call
    ``dist.all_reduce(...)`` through the module (as BucketedDDP and the collectives labs do);
    PyTorch's DDP calls C++ directly, so give it ``emulated_allreduce_hook`` instead. Where
    the real operation is already slower than the model (a link faster than this machine), it
    cannot be sped up: ``.log`` records both times so that case is visible.
    """

    def __init__(self, link="10GbE", algorithm="ring"):
        self.link = get_link(link)
        _check(0, 1, algorithm)
        self.algorithm = algorithm
        self.clock = _LinkClock()
        self.log = []  # (collective, nbytes, world_size, modelled s, real s)
        self._saved = {}

    def modelled(self, op, nbytes, world_size):
        return collective_time(op, nbytes, world_size, self.link.alpha, self.link.beta,
                               self.algorithm)

    def _wrap(self, name, original):
        import torch.distributed as dist
        op, count = _PATCHED[name]
        signature = _signature(original)

        def emulated(*args, **kwargs):
            issued = time.perf_counter()   # the wrapper's own work counts as link time
            bound = signature.bind(*args, **kwargs)
            group = bound.arguments.get("group")
            world_size = dist.get_world_size(group)
            nbytes = count(bound.arguments)
            model = self.modelled(op, nbytes, world_size)
            out = original(*args, **kwargs)
            finish = self.clock.reserve(model, issued)
            if len(self.log) < 10_000:
                self.log.append((name, nbytes, world_size, model,
                                 time.perf_counter() - issued))
            if out is not None and hasattr(out, "wait"):  # async_op=True, isend, irecv
                return _EmulatedWork(out, finish)
            _wait_until(finish)
            return out
        emulated.__wrapped__ = original
        return emulated

    def __enter__(self):
        import torch.distributed as dist
        for name in _PATCHED:
            original = getattr(dist, name)
            self._saved[name] = original
            setattr(dist, name, self._wrap(name, original))
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist
        for name, original in self._saved.items():
            setattr(dist, name, original)
        self._saved = {}
        return False


def emulated_allreduce_hook(link="10GbE", algorithm="ring", compress_dtype=None):
    """A DDP comm hook: average the bucket with all-reduce, taking ``link``'s modelled time.

    ``ddp.register_comm_hook(None, lu.emulation.emulated_allreduce_hook("10GbE"))``. With
    ``compress_dtype=torch.bfloat16`` (or float16) the bucket travels in that dtype, so the
    modelled time halves as the bytes do (PyTorch's bf16_compress_hook refuses CPU tensors).
    The wait happens in the future's callback, off the main thread, so backward keeps running
    while the bucket is "on the wire": overlap behaves as on a real link.
    """
    import torch.distributed as dist
    emulator = emulate(link, algorithm)

    def hook(process_group, bucket):
        group = process_group if process_group is not None else dist.group.WORLD
        world_size = dist.get_world_size(group)
        buffer = bucket.buffer()
        sent = buffer if compress_dtype is None else buffer.to(compress_dtype)
        sent.div_(world_size)
        issued = time.perf_counter()
        original = getattr(dist.all_reduce, "__wrapped__", dist.all_reduce)
        fut = original(sent, group=group, async_op=True).get_future()
        finish = emulator.clock.reserve(
            emulator.modelled("allreduce", _nbytes(sent), world_size), issued)

        def done(f):
            _wait_until(finish)
            out = f.value()[0]
            return out if compress_dtype is None else buffer.copy_(out)
        return fut.then(done)
    hook.emulator = emulator
    return hook
