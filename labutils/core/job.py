"""One launch in flight, seen from the caller: start the ranks, relay their output, read their
results, and end them all on an error, a timeout, a Stop or an interrupt (``launch`` drives
it; ``stop_all`` and ``output_to`` reach it from other threads)."""
from __future__ import annotations

import multiprocessing.connection as mpc
import os
import pickle
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from datetime import timedelta

import cloudpickle

from labutils.core.errors import LaunchStopped, LaunchTimeout, WorkerError
from labutils.core.forkserver import warmup
from labutils.core.i18n import tr
from labutils.core.rank import _local, _worker
from labutils.core.stacks import _describe_exit, _main_stack, _summarise_stack

_ACTIVE = set()            # jobs now running, for stop_all()


_ACTIVE_LOCK = threading.Lock()


def stop_all():
    """End every launch now running in this process (safe to call from any thread)."""
    with _ACTIVE_LOCK:
        for job in list(_ACTIVE):
            job.stop_requested = True


class output_to:
    """Context manager: send rank output lines and progress of launches in this thread to
    ``write(line)`` and ``on_progress(n, total, desc)`` instead of stdout (and no progress).
    Setting ``.stopped`` (a panel's Stop) ends the launch now running in that thread and
    refuses any later one in it, even one that has not started its ranks yet."""

    def __init__(self, write, on_progress=None):
        self.write, self.on_progress = write, on_progress
        self.stopped = False

    def __enter__(self):
        self.saved = getattr(_local, "sink", None)
        _local.sink = self
        return self

    def __exit__(self, *exc):
        _local.sink = self.saved


def _loopback_store(timeout):
    """The rendezvous store, listening on 127.0.0.1 only (never on every interface)."""
    import torch.distributed as dist
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))  # port 0: the OS picks a free port
        sock.listen(128)
        port = sock.getsockname()[1]
        # the store takes ownership of the descriptor (it closes it when it goes)
        return dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                             timeout=timedelta(seconds=timeout), master_listen_fd=sock.detach())
    finally:
        sock.close()  # a no-op once detached; closes the socket if the store failed


class _Job:
    def __init__(self, fn, args, kwargs, world_size, backend, timeout, threads):
        self.world_size, self.backend, self.timeout, self.threads = (
            world_size, backend, timeout, threads)
        try:
            self.payload = cloudpickle.dumps((fn, args, kwargs))
        except Exception as e:  # noqa: BLE001
            raise TypeError(f"could not send fn and its arguments to the ranks ({e}); pass "
                            f"plain values (numbers, tensors, lists) or build objects inside fn")
        self.stop_requested = False
        self.sink = getattr(_local, "sink", None)
        self.partial = [b""] * world_size
        self.held = [[] for _ in range(world_size)]  # ranks > 0: shown after rank 0
        self.interrupted = False  # a rank saw the kernel's interrupt

    # -- output --------------------------------------------------------------------------
    def _emit(self, rank, line):
        text = f"[rank {rank}] {line}"
        if self.sink is not None:
            self.sink.write(text)
        else:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def _feed(self, rank, data):
        buf = self.partial[rank] + data
        *lines, self.partial[rank] = buf.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            if "\r" in line:  # a progress bar redrawn in place: keep its last state
                line = line.rsplit("\r", 1)[-1]
            if rank == 0:
                self._emit(0, line)
            else:
                self.held[rank].append(line)

    def _flush_output(self):
        for rank in range(self.world_size):
            if self.partial[rank]:
                self._feed(rank, b"\n")
        for rank in range(1, self.world_size):
            for line in self.held[rank]:
                self._emit(rank, line)
            self.held[rank] = []

    def _progress(self, n, total, desc):
        # Only a panel (an output_to sink) shows progress. A bar in a plain cell would be stored
        # in the notebook with its rate and time, different on every run.
        if self.sink is not None and self.sink.on_progress is not None:
            self.sink.on_progress(n, total, desc)

    # -- lifecycle -----------------------------------------------------------------------
    def _stopping(self):
        return self.stop_requested or (self.sink is not None and self.sink.stopped)

    def run(self):
        if self._stopping():  # Stop pressed before this launch began: start nothing
            raise LaunchStopped(tr("stopped: every rank was ended"))
        ctx = warmup()
        store = _loopback_store(self.timeout)
        prefix = "lu-" + secrets.token_hex(8)  # a job nobody else can join by accident
        self.tmp = tempfile.mkdtemp(prefix="lu-launch-")
        self.procs, self.outs, self.results = [], {}, {}  # results: rank -> open pipe
        conns = []
        with _ACTIVE_LOCK:
            _ACTIVE.add(self)
        try:
            for rank in range(self.world_size):
                out_r, out_w = ctx.Pipe(duplex=False)
                res_r, res_w = ctx.Pipe(duplex=False)
                p = ctx.Process(
                    target=_worker, name=f"lu-rank{rank}", daemon=True,
                    args=(rank, self.world_size, self.payload, store.port, prefix,
                          self.backend, self.threads, out_w, res_w, self._stack_path(rank),
                          os.getpid(), self.timeout))
                p.start()
                out_w.close(), res_w.close()
                self.procs.append(p)
                self.outs[rank] = out_r
                self.results[rank] = res_r
                conns += [out_r, res_r]
            return self._wait()
        finally:
            self._end_all()
            self._flush_output()
            for conn in conns:
                conn.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
            with _ACTIVE_LOCK:
                _ACTIVE.discard(self)
            del store

    def _stack_path(self, rank):
        return os.path.join(self.tmp, f"stack-{rank}.txt")

    def _wait(self):
        deadline = time.monotonic() + self.timeout
        values, errors, exited = {}, [], {}
        by_conn = {}
        for rank in range(self.world_size):
            by_conn[self.outs[rank]] = ("out", rank)
            by_conn[self.results[rank]] = ("res", rank)
            by_conn[self.procs[rank].sentinel] = ("exit", rank)
        problem_since = None
        while True:
            done = [r for r in range(self.world_size) if r in exited and r not in self.results]
            if len(values) == self.world_size and len(done) == self.world_size:
                return [values[r] for r in range(self.world_size)]
            errored = {e[1] for e in errors}
            dead = [r for r in done if r not in values and r not in errored]
            if (errors or dead) and problem_since is None:
                problem_since = time.monotonic()
            if problem_since is not None and (time.monotonic() - problem_since > 0.2
                                              or len(done) == self.world_size):
                # Grace period over. A rank that died without a word is the cause; else the
                # earliest exception is, later ones are peers losing their connection to it.
                if dead:
                    raise WorkerError(_describe_exit(dead[0], exited[dead[0]]),
                                      rank=dead[0], exitcode=exited[dead[0]])
                _, rank, name, msg, tb, _ = min(errors, key=lambda e: (e[0], e[1]))
                raise WorkerError(f"rank {rank}: {name}: {msg}", rank=rank, exitcode=1,
                                  remote_traceback=tb)
            if self._stopping() or self.interrupted:
                raise LaunchStopped(tr("stopped: every rank was ended"))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timeout_error([r for r in range(self.world_size)
                                           if r not in values])
            ready = mpc.wait(list(by_conn), timeout=min(remaining, 0.1))
            # Read output and results before exits, so nothing a rank sent is lost.
            ready.sort(key=lambda c: ["out", "res", "exit"].index(by_conn[c][0]))
            for conn in ready:
                if conn not in by_conn:  # already drained after its rank exited
                    continue
                kind, rank = by_conn[conn]
                if kind == "out":
                    data = os.read(conn.fileno(), 1 << 16)
                    if data:
                        self._feed(rank, data)
                    else:
                        del by_conn[conn]
                elif kind == "res":
                    self._read_results(rank, conn, by_conn, values, errors)
                else:
                    self.procs[rank].join()
                    exited[rank] = self.procs[rank].exitcode
                    del by_conn[conn]
                    self._drain(rank, by_conn, values, errors)

    def _drain(self, rank, by_conn, values, errors):
        """Read what ``rank`` wrote and sent just before it exited."""
        out = self.outs[rank]
        while out in by_conn and out.poll(0):
            data = os.read(out.fileno(), 1 << 16)
            if not data:
                del by_conn[out]
                break
            self._feed(rank, data)
        res = self.results.get(rank)
        if res is not None and res in by_conn:
            self._read_results(rank, res, by_conn, values, errors)

    def _read_results(self, rank, conn, by_conn, values, errors):
        while conn in by_conn and conn.poll(0):
            try:
                message = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                del by_conn[conn]
                self.results.pop(rank, None)
                conn.close()
                return
            if message[0] == "ok":
                values[rank] = message[1]
            elif message[0] == "progress":
                self._progress(*message[1:])
            elif message[0] == "interrupted":
                self.interrupted = True
            else:
                errors.append(message[1:2] + (rank,) + message[2:])

    def _timeout_error(self, stuck):
        for r in stuck:
            if self.procs[r].is_alive():
                try:
                    os.kill(self.procs[r].pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
        stacks, parts = {}, []
        for r in stuck:
            text = self._read_stack_dump(r)
            stacks[r] = text.split("\n", 1)[1] if "\n" in text else text
            parts.append(f"rank {r} {_summarise_stack(_main_stack(text))}")
        return LaunchTimeout(tr("launch timed out after {timeout:g} s; still running: {stuck}",
                                timeout=self.timeout, stuck=tr("; ").join(parts)),
                             rank=stuck[0] if stuck else None, stacks=stacks, stuck=parts)

    def _read_stack_dump(self, rank, wait=2.0):
        """The rank's faulthandler dump, once written: poll until the file holds a thread's
        stack and stops growing (or the rank died, or ``wait`` s passed), then read it."""
        path, last, deadline = self._stack_path(rank), -1, time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                size = os.path.getsize(path)
            except OSError:
                return ""
            if size == last and last > 0:
                with open(path) as f:
                    text = f.read()
                if "most recent call first" in text or not self.procs[rank].is_alive():
                    return text
            last = size
            time.sleep(0.02)
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""

    def _end_all(self):
        """SIGTERM every rank still alive, SIGKILL after 1 s, and reap them all."""
        alive = [p for p in self.procs if p.is_alive()]
        for p in alive:
            p.terminate()
        deadline = time.monotonic() + 1.0
        for p in alive:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in alive:
            if p.is_alive():
                p.kill()
                p.join()
        for p in self.procs:
            p.join(0)
            p.close()
