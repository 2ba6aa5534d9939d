"""Start real ranks from a notebook cell: ``lu.launch(fn, *args, world_size=2)``.

Used by every lab, first in ``01_introduction``. How it works:

* Processes come from a multiprocessing *forkserver* that has already imported torch and
  labutils, so a warm launch costs a ``fork()`` (milliseconds) instead of a fresh interpreter
  importing torch (seconds). The kernel itself is never forked (it is multi-threaded, and may
  hold a CUDA context); the forkserver never touches CUDA.
* ``fn`` travels by value with cloudpickle, so functions defined in a notebook cell work.
* Rendezvous: the caller holds a ``TCPStore`` on a socket it bound to 127.0.0.1 port 0 (the
  OS picks a free port, no race; a store given only a port would listen on every interface,
  reachable from a classroom's network), and every launch uses a fresh random key prefix, so
  two kernels (or two launches) never join each other's job. gloo's own sockets are kept on
  the loopback interface too: ``lu.launch`` is single-host by design (``python -m
  labutils.core.run`` under torchrun is the multi-node path).
* Each rank's stdout and stderr go through a pipe to the caller, prefixed ``[rank N]``.
  Rank 0 is shown live; the other ranks are shown after it, in rank order, so the output of a
  cell is the same on every run.
* Failures come back as ``WorkerError`` (an exception in a rank, or a rank that died) or
  ``LaunchTimeout`` (with the Python stack where each rank is stuck); the other ranks are
  ended. An interrupt ends every rank; ranks die with the kernel (parent-death signal).

This module checks the input and starts a launch; the pieces live beside it: ``forkserver``
(the warm process server), ``job`` (one launch in flight, from the caller), ``rank`` (what runs
in each process), ``stacks`` (a stuck rank's stack in words) and ``errors``.
"""
from __future__ import annotations

import os
import threading
import time
import warnings

from labutils.core.env import cpu_count
from labutils.core.errors import LaunchInterrupted, LaunchStopped
from labutils.core.i18n import tr
from labutils.core.job import _Job

BACKENDS = ("auto", "gloo", "nccl")


# ----------------------------------------------------------------------------------------
# Input checks: refuse bad input before any process starts, and say what to do instead.

def _cuda_device_count():
    import torch
    # device_count() asks NVML/the driver without creating a CUDA context, so the kernel
    # stays fork-safe; the forkserver never calls it.
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _check_inputs(fn, world_size, backend, timeout, threads_per_rank):
    if not callable(fn):
        raise TypeError(f"fn must be a function called as fn(rank, world_size, ...); "
                        f"got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int >= 1 (e.g. world_size=2); "
                        f"got {world_size!r} of type {type(world_size).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1; got {world_size}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}")
    if threads_per_rank is not None and (not isinstance(threads_per_rank, int)
                                         or threads_per_rank < 1):
        raise ValueError(f"threads_per_rank must be None or an int >= 1; got {threads_per_rank!r}")
    if backend == "nccl":
        found = _cuda_device_count()
        if found < world_size:
            raise ValueError(f"backend='nccl' needs one CUDA device per rank: world_size="
                             f"{world_size} but {found} found; use backend='gloo' (or 'auto')")


def _env_threads():
    """OMP_NUM_THREADS, when set to a positive int, caps every rank's threads (as it does for
    any PyTorch process); ``make test-portable`` runs the labs so, with one thread per rank."""
    try:
        n = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return None
    return n if n >= 1 else None


def default_threads(world_size):
    """The intra-op threads each of ``world_size`` ranks gets when ``launch`` is not told:
    ``OMP_NUM_THREADS`` if set, else an equal share of the cores (at least 1). A one-process
    baseline that should use the same cores as ``world_size`` ranks runs
    ``world_size * default_threads(world_size)`` threads."""
    return _env_threads() or max(1, cpu_count() // world_size)


def resolve_backend(backend, world_size):
    """'auto' means nccl when every rank can have its own GPU, gloo otherwise."""
    if backend != "auto":
        return backend
    return "nccl" if _cuda_device_count() >= world_size else "gloo"


# ----------------------------------------------------------------------------------------
# Caller side.


class OversubscriptionWarning(UserWarning):
    """More ranks than cores: the ranks share cores, so timings measure the sharing."""


_WARNED = {}  # warnings' registry for OversubscriptionWarning: once per message


def launch(fn, *args, world_size=2, backend="auto", timeout=120.0, threads_per_rank=None,
           warn_oversubscription=True, **kwargs):
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` real processes.

    Each process has a ``torch.distributed`` process group (gloo on CPU, nccl when
    ``backend="auto"`` and every rank can have its own GPU, rank r on ``cuda:r``).
    Returns the ranks' return values as a list indexed by rank.

    Each rank runs ``threads_per_rank`` intra-op threads; by default ``OMP_NUM_THREADS`` if
    set, else ``cores // world_size`` (at least 1). Single-host: the store and gloo listen
    on 127.0.0.1 only.

    More ranks than cores warn (timings would measure the sharing), unless
    ``warn_oversubscription=False``: for runs that time nothing (a correctness check, ranks that
    mostly wait), where the warning would only print this machine's core count.
    """
    _check_inputs(fn, world_size, backend, timeout, threads_per_rank)
    backend = resolve_backend(backend, world_size)
    cores = cpu_count()
    threads = threads_per_rank or default_threads(world_size)
    job = _Job(fn, args, kwargs, world_size, backend, float(timeout), threads)
    if warn_oversubscription and world_size > cores:
        message = tr("{world_size} ranks on {cores} cores: ranks will share cores "
                     "(oversubscription), so timings will be slower than with {cores} ranks",
                     world_size=world_size, cores=cores)
        if job.sink is not None:   # a panel's thread: a warning there would reach no cell
            job.sink.write(tr("warning: {message}", message=message))
        else:
            # one plain line in the cell, without this machine's file path: named for
            # lu.launch, shown once per message in a kernel (the registry), as warnings.warn
            warnings.warn_explicit(message, OversubscriptionWarning, "lu.launch", 0,
                                   registry=_WARNED)
    in_cell = threading.current_thread() is threading.main_thread() and job.sink is None
    try:
        return job.run()
    except KeyboardInterrupt:
        # every rank has been ended by now (run's finally); one line, not the launcher's frames
        raise LaunchInterrupted(tr("stopped: every rank was ended")) from None
    except LaunchStopped:
        if in_cell and job.interrupted:   # the ranks saw the interrupt before this thread did
            raise LaunchInterrupted(tr("stopped: every rank was ended")) from None
        raise


# ---- what a launch costs, apart from the work (lab 01) ----------------------------------------

def _timed_call(rank, world_size, fn, *args, **kwargs):
    """Runs in each rank: ``fn``'s own time, measured inside the rank (no process start, no
    rendezvous), next to its result."""
    t0 = time.perf_counter()
    result = fn(rank, world_size, *args, **kwargs)
    return result, time.perf_counter() - t0


def timed_launch(fn, *args, world_size=2, **kwargs):
    """``launch`` that separates the work from the launch: returns ``(results, seconds, wall)``,
    where ``seconds[r]`` is how long ``fn`` ran inside rank ``r`` and ``wall`` the caller's wall
    time of the whole launch. ``wall - max(seconds)`` is what starting the ranks, rendezvous and
    returning the results added: a job ends with its slowest rank."""
    t0 = time.perf_counter()
    out = launch(_timed_call, fn, *args, world_size=world_size, **kwargs)
    wall = time.perf_counter() - t0
    return [r for r, _ in out], [s for _, s in out], wall
