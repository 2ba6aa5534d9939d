"""JupyterLab's Stop (the kernel interrupt) in a real kernel: during a launch in a plain cell
and during a panel's run, it ends every rank and says so in one line."""
import os
import queue
import time

import psutil
import pytest
from jupyter_client.manager import start_new_kernel

pytestmark = [pytest.mark.slow, pytest.mark.lab01]

SETUP = """
import os, time
import labutils as lu

def sleeper(rank, world_size, pid_dir):
    with open(os.path.join(pid_dir, f"{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
"""


@pytest.fixture
def kernel():
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def execute(kc, code, timeout=120, during=None):
    """Run ``code`` (calling ``during()`` once it was sent); return (reply content, stream
    text, error outputs as the notebook shows them)."""
    msg_id = kc.execute(code)
    if during is not None:
        during()
    text, errors = [], []
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no reply to {code!r} in {timeout} s") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            text.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            errors.append(msg["content"])
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    while True:  # the reply to this request: a busy kernel may still owe replies to earlier ones
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"], "".join(text), errors


def wait_for_pids(pid_dir, n=2, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        files = [os.path.join(pid_dir, f"{r}.pid") for r in range(n)]
        if all(os.path.exists(f) and open(f).read() for f in files):
            return [int(open(f).read()) for f in files]
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.05)


def all_gone(pids, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_stop_during_a_launch_in_a_cell_is_one_line(kernel, tmp_path):
    km, kc = kernel
    execute(kc, SETUP)
    pids = []

    def stop_once_running():
        pids.extend(wait_for_pids(tmp_path))
        km.interrupt_kernel()
    reply, _, errors = execute(
        kc, f"lu.launch(sleeper, {str(tmp_path)!r}, world_size=2, timeout=600)",
        during=stop_once_running)
    assert reply["status"] == "error" and reply["ename"] == "LaunchInterrupted"
    # what the cell shows: one line, no frames through the launcher, multiprocessing or
    # selectors
    assert [e["traceback"] for e in errors] == [
        ["KeyboardInterrupt: stopped: every rank was ended"]]
    assert all_gone(pids)


def test_stop_during_a_panel_run_stops_the_panel(kernel, tmp_path):
    km, kc = kernel
    execute(kc, SETUP)
    reply, _, _ = execute(kc, f"""
p = lu.widgets.panel(lambda world_size: lu.launch(sleeper, {str(tmp_path)!r},
                     world_size=world_size, timeout=600), world_size=[2])
p.start()
""")
    assert reply["status"] == "ok"
    pids = wait_for_pids(tmp_path)
    km.interrupt_kernel()            # the kernel is idle: the panel runs in a thread
    reply, text, errors = execute(kc, """
assert p.wait(60)
print(p.status.value, "|", p.output.outputs[0]["text"].strip(), "|", type(p.error).__name__)
""")
    assert reply["status"] == "ok", errors
    assert text.strip() == "stopped | stopped: every rank was ended | LaunchStopped"
    assert all_gone(pids)
