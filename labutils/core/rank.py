"""The rank side of ``launch``: what runs in each forked process (set-up, the call, the
result sent back), and ``progress``, which a rank or the caller uses to move a panel's bar."""
import faulthandler
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta

import cloudpickle

_local = threading.local()  # per-thread output sink (panels run launches in a thread)


_PROGRESS_CONN = None  # set in rank 0 so progress() can reach the caller


_SEND_LOCK = threading.Lock()  # the result pipe is written by the rank and its interrupt watcher


def _send(conn, message):
    with _SEND_LOCK:
        conn.send_bytes(pickle.dumps(message))


def progress(n, total, desc=""):
    """Report progress: from rank 0 of a launch it drives the progress bar of the panel that
    started the launch (plain cells show none); called in the caller itself (an experiment made of several launches, or none)
    it drives the bar of the panel running in this thread. Elsewhere it does nothing."""
    if _PROGRESS_CONN is not None:
        _send(_PROGRESS_CONN, ("progress", int(n), int(total), str(desc)))
        return
    sink = getattr(_local, "sink", None)
    if sink is not None and sink.on_progress is not None:
        sink.on_progress(int(n), int(total), str(desc))


def _watch_interrupts(rank, res_w):
    """Jupyter's Stop sends SIGINT to the kernel's whole process group, ranks included. A rank
    does not raise KeyboardInterrupt (each rank would report its own error, and one blocked in
    a C++ collective would not notice); a thread waits for the signal and tells the caller,
    which ends every rank and reports one "stopped". SIGINT stays blocked in every other thread
    (threads inherit the mask), so only this one receives it."""
    def wait():
        signal.sigwait({signal.SIGINT})
        try:
            _send(res_w, ("interrupted", rank))
        except OSError:
            pass
    threading.Thread(target=wait, name="lu-watch-interrupt", daemon=True).start()


def _die_with(launcher_pid):
    """End this rank when the launching process (the kernel) goes, however it goes."""
    if sys.platform.startswith("linux"):
        import ctypes
        PR_SET_PDEATHSIG = 1  # our parent is the forkserver, which exits with the kernel
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))

    def watch():  # the forkserver may take seconds to exit; do not wait for it
        while True:
            time.sleep(0.25)
            try:
                os.kill(launcher_pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:
                pass
    threading.Thread(target=watch, name="lu-watch-launcher", daemon=True).start()


def _forget_forkserver():
    """Drop this rank's copy of the forkserver's keep-alive pipe.

    multiprocessing hands every forked child that pipe (so children could start processes
    of their own); while any rank holds it, the forkserver would outlive a killed kernel and
    so would the ranks. Without it: kernel dies -> forkserver exits -> ranks get SIGKILL.
    """
    try:
        from multiprocessing import forkserver
        server = forkserver._forkserver
        if server._forkserver_alive_fd is not None:
            os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = server._forkserver_address = server._forkserver_pid = None
    except (AttributeError, OSError):
        pass


def _exit_barrier(store, world_size):
    """Return only once every rank has finished ``fn``: a rank that exits early closes its
    gloo connections under peers still connecting or receiving, and they would fail."""
    if store.add("finished", 1) == world_size:
        store.set("all_finished", "1")
    store.wait(["all_finished"])


def _set_up_process(out_w, stack_path, launcher_pid):
    """The rank's process, before torch: output to the caller, death with it, a stack dump on
    SIGUSR1, gloo on loopback."""
    if hasattr(signal, "pthread_sigmask"):  # before any thread starts, so all inherit it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    _forget_forkserver()
    # Everything the rank prints (Python and C++) goes to the caller through this pipe.
    os.dup2(out_w.fileno(), 1)
    os.dup2(out_w.fileno(), 2)
    out_w.close()
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    _die_with(launcher_pid)
    # On SIGUSR1 (sent at a timeout) write every thread's Python stack, even when the rank
    # is blocked inside a C++ collective and could not run a Python signal handler.
    stack_file = open(stack_path, "w")
    stack_file.write(f"MAIN 0x{threading.main_thread().ident:016x}\n")
    stack_file.flush()
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    # gloo listens on the interface named here: loopback, whatever the caller's environment
    # says (one host; nothing of a launch is reachable from the network)
    if sys.platform.startswith("linux"):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    elif sys.platform == "darwin":
        os.environ["GLOO_SOCKET_IFNAME"] = "lo0"
    return stack_file   # kept open by the caller for as long as the rank lives


def _worker(rank, world_size, payload, port, prefix, backend, threads, out_w, res_w,
            stack_path, launcher_pid, timeout):
    global _PROGRESS_CONN
    stack_file = _set_up_process(out_w, stack_path, launcher_pid)  # noqa: F841
    if rank == 0:
        _PROGRESS_CONN = res_w
    if hasattr(signal, "sigwait"):
        _watch_interrupts(rank, res_w)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(threads)
    started = False
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=timedelta(seconds=timeout))
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, store=dist.PrefixStore(prefix, store), rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout))
        started = True
        fn, args, kwargs = cloudpickle.loads(payload)
        result = fn(rank, world_size, *args, **kwargs)
        try:
            message = pickle.dumps(("ok", result))  # by value: no fd sharing that dies with us
        except Exception as e:  # noqa: BLE001 - report what could not be pickled
            raise TypeError(f"rank {rank} returned a value that cannot be sent back "
                            f"({type(result).__name__}): {e}") from None
        sys.stdout.flush(), sys.stderr.flush()
        with _SEND_LOCK:
            res_w.send_bytes(message)
        _exit_barrier(dist.PrefixStore(prefix + "/exit", store), world_size)
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
        sys.stdout.flush(), sys.stderr.flush()
        # Trim this module's own frames so the traceback starts at the learner's code (all of
        # it, when the error was raised here).
        frames = e.__traceback__
        while frames is not None and frames.tb_frame.f_code.co_filename == __file__:
            frames = frames.tb_next
        tb = "".join(traceback.format_exception(type(e), e, frames or e.__traceback__))
        _send(res_w, ("error", time.time(), type(e).__name__, str(e).strip(), tb, started))
        os._exit(1)  # skip destroy_process_group: peers may be gone and it could block
