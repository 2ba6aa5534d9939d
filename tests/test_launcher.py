"""lu.launch: results, notebook functions, errors, deaths, timeouts, interrupts, concurrency,
output order, bad input and leftovers. Every test starts real processes."""
import _thread
import inspect
import ipaddress
import os
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
import torch

import labutils as lu

from .launch_workers import (
    allreduce_rank,
    deadlock,
    die_on,
    listening_sockets,
    num_threads,
    ordered_prints,
    raise_on,
    report_progress,
    sleep_forever,
    unpicklable_result,
)

pytestmark = [pytest.mark.lab01]
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def pid_alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def rank_pids():
    """Live rank processes started by this test process's launcher (forkserver children)."""
    servers = [p for p in psutil.Process().children()
               if "multiprocessing.forkserver" in " ".join(p.cmdline())]
    return {c.pid for s in servers for c in s.children()
            if c.status() != psutil.STATUS_ZOMBIE}


# ---- results ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_results_indexed_by_rank(world_size):
    out = lu.launch(allreduce_rank, world_size=world_size, scale=2.0)
    expected_sum = 2.0 * world_size * (world_size + 1) / 2
    assert [r["rank"] for r in out] == list(range(world_size))
    assert all(r["world_size"] == world_size for r in out)
    for r in out:
        torch.testing.assert_close(r["sum"], torch.tensor([expected_sum]))
    assert len({r["pid"] for r in out} | {os.getpid()}) == world_size + 1  # real processes


@pytest.mark.slow
def test_positional_args_and_local_function():
    offset = 10

    def add(rank, world_size, a, b=0):
        return rank + a + b + offset

    assert lu.launch(add, 1, world_size=2, b=100) == [111, 112]


@pytest.mark.slow
def test_function_defined_in_main_module():
    # What a notebook cell does: a function whose module is __main__ and not importable.
    ns = {"__name__": "__main__"}
    exec(textwrap.dedent("""
        import torch, torch.distributed as dist
        FACTOR = 3
        def helper(x):
            return x * FACTOR
        def fn(rank, world_size):
            t = torch.tensor([helper(rank)])
            dist.all_reduce(t)
            return int(t)
    """), ns)
    assert lu.launch(ns["fn"], world_size=2) == [3, 3]


@pytest.mark.slow
def test_function_defined_in_a_real_notebook_kernel(tmp_path):
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent("""
        import torch, torch.distributed as dist
        import labutils as lu
        def fn(rank, world_size):
            t = torch.ones(2) * rank
            dist.all_reduce(t)
            print("total", t.tolist())
            return t.sum().item()
        print(lu.launch(fn, world_size=2))
    """))]
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={
        "metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert text == ("[rank 0] total [1.0, 1.0]\n[rank 1] total [1.0, 1.0]\n[2.0, 2.0]\n")


# ---- failures -----------------------------------------------------------------------------

@pytest.mark.slow
def test_exception_in_a_rank():
    # the peers wait forever in recv for rank 1: launch must end them, not its timeout
    with pytest.raises(lu.WorkerError) as info:
        lu.launch(raise_on, world_size=3, bad_rank=1, timeout=600)
    err = info.value
    assert str(err) == "rank 1: ValueError: bad value on rank 1"
    assert err.rank == 1 and err.exitcode == 1
    assert "raise_on" in err.remote_traceback and "ValueError" in err.remote_traceback
    assert rank_pids() == set()  # the ranks stuck in recv were ended and reaped


@pytest.mark.parametrize("how, expected", [
    ("exit", "rank 1: process exited with code 3 without returning a result"),
    ("kill", "rank 1: process killed by signal SIGKILL"),
    ("segv", "rank 1: process killed by signal SIGSEGV"),
])
@pytest.mark.slow
def test_rank_that_dies_without_raising(how, expected):
    with pytest.raises(lu.WorkerError) as info:
        lu.launch(die_on, how, world_size=2, timeout=60)
    assert str(info.value) == expected
    assert info.value.rank == 1


@pytest.mark.slow
def test_timeout_names_where_each_rank_is_stuck():
    recv_line = inspect.getsourcelines(deadlock)[1] + 3  # the dist.recv line
    sleep_line = recv_line + 2
    with pytest.raises(lu.LaunchTimeout) as info:
        lu.launch(deadlock, world_size=2, timeout=10)  # the rendezvous runs inside it too
    err = info.value
    assert isinstance(err, TimeoutError) and isinstance(err, lu.WorkerError)
    msg = str(err)
    assert msg.startswith("launch timed out after 10 s; still running: ")
    assert f"rank 1 waiting in dist.recv, line {recv_line} of deadlock" in msg
    assert f"rank 0 in sleep, line {sleep_line} of deadlock" in msg or \
        f"rank 0 running, line {sleep_line} of deadlock" in msg
    assert "deadlock" in err.stacks[1]
    assert rank_pids() == set()


@pytest.mark.slow
def test_unpicklable_return_value():
    with pytest.raises(lu.WorkerError, match=r"^rank 0: TypeError: rank 0 returned a value"):
        lu.launch(unpicklable_result, world_size=1)


class when_started:
    """Call ``action`` from a thread once every rank has written its pid file; ``cancel()``
    stops the thread before it acts (if it has not yet) and waits for it."""

    def __init__(self, tmp_path, action, world_size=2):
        self.cancelled, self.acted = threading.Event(), threading.Event()

        def wait_then_act():
            while len(list(tmp_path.glob("rank*.pid"))) < world_size:
                if self.cancelled.wait(0.05):
                    return
            action()
            self.acted.set()
        self.thread = threading.Thread(target=wait_then_act, daemon=True)
        self.thread.start()

    def cancel(self):
        self.cancelled.set()
        self.thread.join()


@pytest.mark.slow
def test_interrupt_ends_every_rank(tmp_path):
    """The interrupt reaches launch while both ranks sleep; when launch has raised, every rank
    is already dead and reaped (how long that takes is `bench launch`'s shutdown figure)."""
    timer = when_started(tmp_path, _thread.interrupt_main)
    try:
        with pytest.raises(KeyboardInterrupt):
            lu.launch(sleep_forever, str(tmp_path), world_size=2, timeout=600)
    finally:
        timer.cancel()
    assert timer.acted.is_set()
    pids = [int((tmp_path / f"rank{r}.pid").read_text()) for r in range(2)]
    assert not any(pid_alive(p) for p in pids)
    assert rank_pids() == set()


@pytest.mark.slow
def test_stop_all_from_another_thread(tmp_path):
    timer = when_started(tmp_path, lu.stop_all)
    try:
        with pytest.raises(lu.LaunchStopped):
            lu.launch(sleep_forever, str(tmp_path), world_size=2, timeout=600)
    finally:
        timer.cancel()
    pids = [int((tmp_path / f"rank{r}.pid").read_text()) for r in range(2)]
    assert not any(pid_alive(p) for p in pids)


SCRIPT = """
import sys, torch, torch.distributed as dist
import labutils as lu
sys.path.insert(0, {tests!r})
import launch_workers as t

def fn(rank, world_size, token):
    t = torch.tensor([token + rank])
    dist.all_reduce(t)
    return int(t)

if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "orphan":
        lu.launch(t.sleep_forever, sys.argv[2], world_size=2, timeout=120)
    else:
        token = int(sys.argv[2])
        for _ in range(5):
            assert lu.launch(fn, token, world_size=2) == [2 * token + 1] * 2
        print("ok", token)
"""


def _script(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(SCRIPT.format(tests=HERE))
    return str(path)


@pytest.mark.slow
def test_killed_kernel_takes_its_ranks_with_it(tmp_path):
    proc = subprocess.Popen([sys.executable, _script(tmp_path), "orphan", str(tmp_path)])
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("rank*.pid"))) < 2:
            assert time.monotonic() < deadline, "ranks did not start"
            time.sleep(0.1)
        time.sleep(0.2)
        pids = [int((tmp_path / f"rank{r}.pid").read_text()) for r in range(2)]
        assert all(pid_alive(p) for p in pids)
        proc.kill()  # like a kernel restart: no chance to clean up
        proc.wait()
        # no speed asserted: the ranks must go by themselves (parent-death signal, watchdog);
        # the deadline only keeps a broken build from hanging the suite
        deadline = time.monotonic() + 120
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(pid_alive(p) for p in pids)
    finally:
        proc.kill()


@pytest.mark.slow
def test_two_kernels_launching_at_once_never_mix(tmp_path):
    script = _script(tmp_path)
    procs = [subprocess.Popen([sys.executable, script, "job", str(token)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for token in (100, 200)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for token, p, out in zip((100, 200), procs, outs):
        assert p.returncode == 0, out
        assert f"ok {token}" in out


@pytest.mark.slow
def test_concurrent_launches_from_threads():
    results = {}

    def go(scale):
        results[scale] = lu.launch(allreduce_rank, world_size=2, scale=scale)

    threads = [threading.Thread(target=go, args=(s,)) for s in (1.0, 10.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for scale in (1.0, 10.0):
        assert [float(r["sum"]) for r in results[scale]] == [3.0 * scale] * 2


# ---- output -------------------------------------------------------------------------------

@pytest.mark.slow
def test_output_prefixed_and_in_rank_order(capsys):
    expected = ("[rank 0] hello from 0\n[rank 0] second line 0\n"
                "[rank 1] hello from 1\n[rank 1] second line 1\n"
                "[rank 2] hello from 2\n[rank 2] second line 2\n")
    for _ in range(3):
        assert lu.launch(ordered_prints, world_size=3) == [0, 1, 2]
        assert capsys.readouterr().out == expected


@pytest.mark.slow
def test_output_to_sink_and_progress():
    lines, progress = [], []
    with lu.job.output_to(lines.append, lambda n, total, desc: progress.append((n, total))):
        lu.launch(report_progress, world_size=2)
        lu.launch(ordered_prints, world_size=2)
    assert progress == [(1, 3), (2, 3), (3, 3)]
    assert lines[0] == "[rank 0] hello from 0" and lines[-1] == "[rank 1] second line 1"


# ---- threads and bad input ----------------------------------------------------------------

@pytest.mark.slow
def test_threads_per_rank():
    cores = lu.env.cpu_count()
    assert lu.launch(num_threads, world_size=2) == [max(1, cores // 2)] * 2
    assert lu.launch(num_threads, world_size=1, threads_per_rank=1) == [1]


@pytest.mark.slow
def test_more_ranks_than_cores_warns_and_runs():
    n = lu.env.cpu_count() + 1
    with pytest.warns(UserWarning, match="oversubscription"):
        out = lu.launch(num_threads, world_size=n)
    assert out == [1] * n


@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(world_size=0), ValueError, "world_size must be >= 1"),
    (dict(world_size=1.5), TypeError, "world_size must be an int"),
    (dict(world_size="2"), TypeError, "world_size must be an int"),
    (dict(world_size=True), TypeError, "world_size must be an int"),
    (dict(backend="mpi"), ValueError, "use one of auto, gloo, nccl"),
    (dict(backend="nccl"), ValueError, "needs one CUDA device per rank.*found; use backend='gloo'"),
    (dict(timeout=0), ValueError, "timeout must be a positive"),
    (dict(threads_per_rank=0), ValueError, "threads_per_rank"),
])
def test_bad_input_refused_before_any_process(kwargs, exc, pattern):
    if kwargs.get("backend") == "nccl" and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has GPUs enough for nccl")
    before = rank_pids()
    with pytest.raises(exc, match=pattern):
        lu.launch(allreduce_rank, **kwargs)
    assert rank_pids() == before


def test_fn_not_callable():
    with pytest.raises(TypeError, match="fn must be a function"):
        lu.launch("allreduce_rank", world_size=2)


def test_unpicklable_arguments_refused_before_start():
    with pytest.raises(TypeError, match="could not send fn and its arguments"):
        lu.launch(allreduce_rank, world_size=2, scale=threading.Lock())


# ---- network: nothing of a launch is reachable from another machine ----------------------

@pytest.mark.slow
def test_nothing_listens_beyond_loopback(monkeypatch):
    # even when the caller's environment names a real interface for gloo
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    out = lu.launch(listening_sockets, os.getpid(), world_size=2)
    seen = {name: addrs for per_rank in out for name, addrs in per_rank.items()}
    assert set(seen) == {"caller", "rank 0", "rank 1"}
    assert seen["caller"], "the rendezvous store should be listening during the launch"
    for name, addrs in seen.items():
        for ip, port in addrs:
            assert ipaddress.ip_address(ip).is_loopback, f"{name} listens on {ip}:{port}"


# ---- no leftovers -------------------------------------------------------------------------

@pytest.mark.slow
def test_no_growth_in_processes_fds_threads():
    me = psutil.Process()
    lu.launch(allreduce_rank, world_size=2)  # warm: forkserver running
    with pytest.raises(lu.WorkerError):
        lu.launch(raise_on, world_size=2)
    before = (me.num_fds(), me.num_threads(), len(me.children(recursive=True)))
    for _ in range(8):
        lu.launch(allreduce_rank, world_size=2)
        with pytest.raises(lu.WorkerError):
            lu.launch(raise_on, world_size=2)
    # the forkserver reaps the last ranks on its own schedule: wait for it (no speed asserted)
    deadline = time.monotonic() + 60
    while len(me.children(recursive=True)) > before[2] and time.monotonic() < deadline:
        time.sleep(0.05)
    after = (me.num_fds(), me.num_threads(), len(me.children(recursive=True)))
    # No growth; a count may fall when a thread of an earlier test (a timer) finishes.
    assert all(a <= b for a, b in zip(after, before)), (after, before)
    zombies = [p for p in me.children(recursive=True) if p.status() == psutil.STATUS_ZOMBIE]
    assert zombies == []


# ---- torchrun entry point -----------------------------------------------------------------

def test_run_parses_kwargs():
    from labutils.core.run import parse_kwargs, parse_target
    assert parse_kwargs(["--steps", "3", "--lr=0.1", "--name", "x", "--some-flag"]) == \
        {"steps": 3, "lr": 0.1, "name": "x", "some_flag": True}
    assert parse_target("labutils.bench.launch:_one_allreduce").__name__ == "_one_allreduce"
    with pytest.raises(SystemExit, match="no ':function' part"):
        parse_target("labutils.bench")


@pytest.mark.slow
def test_same_function_under_torchrun():
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "labutils.core.run", "tests.launch_workers:allreduce_rank", "--scale", "2.0"],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "'sum': tensor([6.])" in out.stdout and "'world_size': 2" in out.stdout


@pytest.mark.slow
def test_run_outside_torchrun_says_how():
    out = subprocess.run([sys.executable, "-m", "labutils.core.run", "labutils.bench.launch:_one_allreduce"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k not in ("RANK",)})
    assert out.returncode != 0 and "start this under torchrun" in out.stderr


def test_env_report():
    from labutils.core.env import recommended_world_sizes
    assert recommended_world_sizes(2, 0) == (1, 2)
    assert recommended_world_sizes(6, 0) == (1, 2, 4, 6)
    assert recommended_world_sizes(16, 8) == (1, 2, 4, 8)
    r = lu.env.report()
    assert r.cores == lu.env.cpu_count() and r.backends["gloo"]
    assert "recommended world sizes" in str(r)
