"""Worker functions for test_launcher.py, in a module with light imports: every rank of a
launch imports the module its function lives in."""
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

import labutils as lu


def allreduce_rank(rank, world_size, scale=1.0):
    t = torch.tensor([float(rank + 1)]) * scale
    dist.all_reduce(t)
    return {"rank": rank, "world_size": world_size, "sum": t, "pid": os.getpid()}


def raise_on(rank, world_size, bad_rank=1):
    if rank == bad_rank:
        raise ValueError(f"bad value on rank {rank}")
    dist.recv(torch.zeros(1), src=bad_rank)  # would wait forever for the failed rank


def die_on(rank, world_size, how):
    if rank == 1:
        if how == "exit":
            os._exit(3)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "segv":
            import ctypes
            ctypes.string_at(0)
    dist.barrier()


def deadlock(rank, world_size):
    buf = torch.zeros(1)
    if rank == 1:
        dist.recv(buf, src=0)  # rank 0 never sends
    else:
        time.sleep(60)


def sleep_forever(rank, world_size, pid_dir):
    with open(os.path.join(pid_dir, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)


def ordered_prints(rank, world_size):
    # Rank 1 prints first in time; the caller still shows rank 0 first.
    if rank == 0:
        time.sleep(0.3)
    print(f"hello from {rank}")
    print(f"second line {rank}", file=sys.stderr)
    return rank


def num_threads(rank, world_size):
    return torch.get_num_threads()


def unpicklable_result(rank, world_size):
    return threading.Lock()


def report_progress(rank, world_size):
    for i in range(1, 4):
        lu.progress(i, 3, desc="steps")
    return rank


def listening_sockets(rank, world_size, caller_pid):
    """Every inet socket in LISTEN state of the caller and of this rank, taken while all
    ranks are inside the process group (after a collective, before the final barrier)."""
    import psutil
    t = torch.ones(1)
    dist.all_reduce(t)  # gloo's connections are up
    found = {}
    for name, proc in (("caller", psutil.Process(caller_pid)), (f"rank {rank}", psutil.Process())):
        found[name] = [(c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                       if c.status == psutil.CONN_LISTEN]
    dist.barrier()
    return found
