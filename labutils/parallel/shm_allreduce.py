"""A shared-memory all-reduce for ranks on one host: reduce-scatter and all-gather through RAM.

Used by 04c (why gloo is slow on one machine, and what shared memory changes) and by
``python -m labutils.bench ddp``. gloo sends every byte through the loopback TCP stack (copies
into and out of socket buffers, a system call per message); ranks on one host can instead read
each other's pages. For each chunk of the tensor (default 4 MiB, so the working set stays in
cache), with p ranks:

1. every rank copies its chunk into its own input slot of a shared segment;
2. barrier;
3. rank r sums slice r of all p inputs into the shared output (a reduce-scatter: each rank
   reads n/p of every input, all ranks in parallel);
4. it copies the next chunk in, then barrier;
5. every rank copies the whole output chunk back (an all-gather, by reading).

Input and output slots are double-buffered, so one barrier per chunk is enough: a rank can
only overwrite a slot two chunks later, after a barrier its slower peers must have passed.
The barrier is a flag protocol (each rank bumps its own counter in the segment and spins until
all counters reach it): microseconds, no system call.

Copying in and out costs more memory traffic than the sum: about 5.5 bytes moved per byte
reduced on 2 ranks. ``ShmAllReduce(buffer_bytes=n).buffer(numel)`` gives each rank a tensor
that lives in the segment; ``all_reduce_`` of it is zero-copy (each rank sums its slice of
every rank's buffer in place, then reads the other slices): about 2.5 bytes per byte.

The segment is unlinked as soon as every rank has mapped it, so nothing is left in /dev/shm
even if a rank is killed.

Memory ordering: the flag protocol relies on x86's total store order (a peer that sees my flag
also sees the data I wrote before it). ARM (Apple silicon, Graviton, ...) and POWER may make
the flag visible first, so a peer could sum stale data: a silently wrong result. Python has no
memory fence to put between them, so on those CPUs ``ShmAllReduce`` refuses to start
(``UnsupportedCPU``), and ``make_all_reduce()`` falls back to gloo with a warning.
"""
from __future__ import annotations

import mmap
import os
import platform
import secrets
import tempfile
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist

_LINE = 64                     # one cache line per rank's counter: no false sharing
# Linux keeps /dev/shm in RAM; elsewhere a temporary file's pages serve (mapped, not read).
_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
_SPIN_S = 200e-6               # spin this long before yielding the core to other processes
_YIELD = getattr(os, "sched_yield", lambda: time.sleep(0))


# CPUs whose stores become visible to other cores in program order (total store order)
STORE_ORDERED = ("x86_64", "amd64", "i386", "i486", "i586", "i686", "x86")


class UnsupportedCPU(RuntimeError):
    """The shared-memory all-reduce would be unsafe on this CPU (no total store order)."""


def supported(machine=None):
    """True on x86 CPUs, where the flag protocol is correct; False elsewhere (ARM, POWER)."""
    return (machine or platform.machine()).lower() in STORE_ORDERED


def _refuse_unless_supported():
    machine = platform.machine()
    if not supported(machine):
        raise UnsupportedCPU(
            f"the shared-memory all-reduce needs x86's total store order; this CPU is "
            f"{machine!r}, where a peer could see a flag before the data it guards and sum "
            f"stale values. Use gloo: dist.all_reduce, or "
            f"lu.shm_allreduce.make_all_reduce(), which falls back to it")


class GlooAllReduce:
    """The fall-back with ``ShmAllReduce``'s interface: ``all_reduce_`` is ``dist.all_reduce``
    and ``buffer`` an ordinary tensor."""

    def __init__(self, group=None, **_ignored):
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)

    def buffer(self, numel, dtype=torch.float32):
        return torch.zeros(numel, dtype=dtype)

    def all_reduce_(self, tensor):
        dist.all_reduce(tensor, group=self.group)
        return tensor

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def make_all_reduce(group=None, **kwargs):
    """``ShmAllReduce(group, **kwargs)`` on x86; elsewhere a warning and ``GlooAllReduce``
    (same interface), never a silently wrong sum."""
    if supported():
        return ShmAllReduce(group, **kwargs)
    warnings.warn(f"shared-memory all-reduce unavailable on {platform.machine()!r} (it needs "
                  f"x86's store order): using gloo instead, so figures labelled 'shm' are "
                  f"gloo's on this machine", RuntimeWarning, stacklevel=2)
    return GlooAllReduce(group)


class ShmAllReduce:
    """``ShmAllReduce(group=None, chunk_bytes=4 MiB)``, created collectively on every rank;
    ``all_reduce_(tensor)`` sums in place like ``dist.all_reduce``; ``close()`` when done."""

    def __init__(self, group=None, chunk_bytes=4 << 20, timeout=60.0, buffer_bytes=0):
        if chunk_bytes < _LINE or chunk_bytes % _LINE:
            raise ValueError(f"chunk_bytes must be a positive multiple of {_LINE}; "
                             f"got {chunk_bytes}")
        if buffer_bytes < 0:
            raise ValueError(f"buffer_bytes must be >= 0; got {buffer_bytes}")
        _refuse_unless_supported()  # on every rank, before any collective: all refuse alike
        self.group, self.timeout = group, timeout
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.chunk_bytes = chunk_bytes
        self.turn, self.epoch = 0, 0   # chunks done (buffer parity), barriers passed
        p = self.world_size
        self.in_offset = p * _LINE
        self.out_offset = self.in_offset + 2 * p * chunk_bytes
        # optional zero-copy slots: one per rank, each rank's tensor lives in shared memory
        self.buffer_bytes = -(-buffer_bytes // _LINE) * _LINE
        self.buf_offset = self.out_offset + 2 * chunk_bytes
        size = self.buf_offset + p * self.buffer_bytes
        # Rank 0 names the segment; the name reaches the others through the process group.
        token = torch.tensor([secrets.randbits(62) if self.rank == 0 else 0], dtype=torch.int64)
        dist.broadcast(token, src=dist.get_global_rank(group, 0) if group else 0, group=group)
        path = os.path.join(_SHM_DIR, f"lu_shm_{int(token):x}")
        if self.rank == 0:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, size)  # zero-filled: every flag starts at 0
        dist.barrier(group=group)
        if self.rank != 0:
            fd = os.open(path, os.O_RDWR)
        self.mm = mmap.mmap(fd, size)
        os.close(fd)  # the mapping keeps the memory alive
        dist.barrier(group=group)
        if self.rank == 0:
            os.unlink(path)  # every rank has it mapped: the name is no longer needed
        self.base = torch.frombuffer(self.mm, dtype=torch.uint8)
        self.flags = np.frombuffer(self.mm, dtype=np.int64, count=p * _LINE // 8)[::_LINE // 8]

    # -- the protocol ------------------------------------------------------------------
    def _barrier(self):
        self.epoch += 1
        self.flags[self.rank] = self.epoch
        if self.flags.min() >= self.epoch:
            return
        start = time.perf_counter()
        while self.flags.min() < self.epoch:
            waited = time.perf_counter() - start
            if waited > _SPIN_S:     # a busy or oversubscribed machine: let the peer run
                _YIELD()
            if waited > self.timeout:
                late = [r for r, f in enumerate(self.flags) if f < self.epoch]
                raise TimeoutError(f"shm all-reduce: rank {self.rank} waited "
                                   f"{self.timeout:g} s for ranks {late}")

    def _slot(self, offset, dtype, n):
        size = torch.empty((), dtype=dtype).element_size()
        return self.base[offset:offset + n * size].view(dtype)

    def _input(self, turn, rank, dtype, n):
        p = self.world_size
        return self._slot(self.in_offset + ((turn % 2) * p + rank) * self.chunk_bytes, dtype, n)

    def _output(self, turn, dtype, n):
        return self._slot(self.out_offset + (turn % 2) * self.chunk_bytes, dtype, n)

    def buffer(self, numel, dtype=torch.float32):
        """This rank's zero-copy tensor: ``numel`` elements in the shared segment (zeros at
        first). ``all_reduce_`` of it reads the peers' slots directly, with no copy in or out
        (needs ``ShmAllReduce(buffer_bytes=...)`` large enough). One buffer per rank."""
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if nbytes > self.buffer_bytes:
            raise ValueError(f"buffer of {nbytes} bytes does not fit: create "
                             f"ShmAllReduce(buffer_bytes={nbytes}) (now {self.buffer_bytes})")
        return self._slot(self.buf_offset + self.rank * self.buffer_bytes, dtype, numel)

    def _is_buffer(self, flat):
        if not self.buffer_bytes:
            return False
        start = self.base.data_ptr() + self.buf_offset + self.rank * self.buffer_bytes
        return (flat.data_ptr() == start
                and flat.numel() * flat.element_size() <= self.buffer_bytes)

    def _all_reduce_in_place(self, flat):
        """Zero-copy all-reduce of this rank's ``buffer()``: rank r sums slice r of every
        rank's buffer into its own (a reduce-scatter by reading), barrier, then copies every
        other slice q from rank q's buffer (an all-gather by reading), barrier. Each rank only
        writes its own buffer: slice r in the first phase, while peers read only their own
        slices of it; the other slices in the second, while peers read only slice r."""
        n, p, rank = flat.numel(), self.world_size, self.rank
        bufs = [self._slot(self.buf_offset + q * self.buffer_bytes, flat.dtype, n)
                for q in range(p)]
        bounds = [(n * q // p, n * (q + 1) // p) for q in range(p)]
        lo, hi = bounds[rank]
        self._barrier()                         # every rank's data is in its buffer
        mine = flat[lo:hi]
        for q in range(p):
            if q != rank:
                mine.add_(bufs[q][lo:hi])
        self._barrier()                         # every slice is reduced
        for q in range(p):
            if q != rank:
                qlo, qhi = bounds[q]
                flat[qlo:qhi].copy_(bufs[q][qlo:qhi])
        self._barrier()                         # nobody reads my buffer any more
        return flat

    def all_reduce_(self, tensor):
        """Sum ``tensor`` over the ranks, in place (contiguous CPU tensor, any float dtype).
        A tensor from ``buffer()`` takes the zero-copy path (every rank must pass its own)."""
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError("shm all-reduce needs a contiguous CPU tensor; call "
                             ".contiguous() (and .cpu()) first")
        flat = tensor.view(-1)
        n, p, rank = flat.numel(), self.world_size, self.rank
        if n == 0:
            return tensor
        if self._is_buffer(flat):
            self._all_reduce_in_place(flat)
            return tensor
        step = self.chunk_bytes // flat.element_size()
        chunks = [(s, min(s + step, n)) for s in range(0, n, step)]
        self._input(self.turn, rank, flat.dtype, chunks[0][1]).copy_(flat[:chunks[0][1]])
        self._barrier()
        for k, (s, e) in enumerate(chunks):
            m, turn = e - s, self.turn
            lo, hi = m * rank // p, m * (rank + 1) // p       # my slice of this chunk
            ins = [self._input(turn, r, flat.dtype, m)[lo:hi] for r in range(p)]
            out = self._output(turn, flat.dtype, m)
            if hi > lo and p == 1:
                out.copy_(ins[0])
            elif hi > lo:
                torch.add(ins[0], ins[1], out=out[lo:hi])
                for other in ins[2:]:
                    out[lo:hi].add_(other)
            if k + 1 < len(chunks):                            # next chunk in, other parity
                s2, e2 = chunks[k + 1]
                self._input(turn + 1, rank, flat.dtype, e2 - s2).copy_(flat[s2:e2])
            self._barrier()
            flat[s:e].copy_(out)
            self.turn += 1
        return tensor

    def close(self):
        """Unmap the segment (it was unlinked at creation, so nothing stays in /dev/shm)."""
        if getattr(self, "mm", None) is not None:
            del self.base, self.flags  # views of the mapping must go before it closes
            self.mm.close()
            self.mm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def shm_allreduce_hook(state, bucket):
    """A DDP communication hook: ``ddp.register_comm_hook(ShmAllReduce(), shm_allreduce_hook)``.

    Works with ``DistributedDataParallel`` and ``lu.ddp.BucketedDDP``. It reduces synchronously
    on the calling thread (so it does not overlap with the rest of backward, unlike gloo's
    background thread) and returns a completed future of the averaged bucket.
    """
    tensor = bucket.buffer()
    state.all_reduce_(tensor)
    tensor.div_(state.world_size)
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut
