"""Benchmark ``launch``: a warm ``lu.launch`` against ``torch.multiprocessing.spawn``, and the
time to end every rank."""
import os
import tempfile
import time

from labutils.bench.suite import Row
from labutils.core.errors import LaunchStopped
from labutils.core.job import stop_all
from labutils.core.launcher import launch
from labutils.core.timing import Stats, compare, interleaved


def _one_allreduce(rank, world_size):
    import torch
    import torch.distributed as dist
    t = torch.ones(4)
    dist.all_reduce(t)
    return float(t[0])


def _spawn_worker(rank, world_size, init_file):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    _one_allreduce(rank, world_size)
    dist.barrier()   # leave together (see labutils.core.run): no rank closes gloo under a peer
    dist.destroy_process_group()


def _spawn_job(world_size=2):
    import torch.multiprocessing as tmp
    with tempfile.TemporaryDirectory() as d:  # file rendezvous: no port to collide on
        tmp.spawn(_spawn_worker, args=(world_size, os.path.join(d, "init")),
                  nprocs=world_size, join=True)


def run(quick=False):
    """Warm 2-rank launch doing one all-reduce vs the same job under mp.spawn."""
    launch(_one_allreduce, world_size=2)  # pay the forkserver's torch import once
    stats = interleaved({"lu.launch": lambda: launch(_one_allreduce, world_size=2),
                         "mp.spawn": _spawn_job},
                        repeats=1 if quick else 7, warmup=0)
    ours, spawn = stats["lu.launch"], stats["mp.spawn"]
    shutdown = Stats.of([_shutdown_seconds() for _ in range(1 if quick else 5)])
    return [Row("launch", "warm lu.launch, 2 ranks, 1 all-reduce", ours, "s"),
            Row("launch", "torch.multiprocessing.spawn, same job", spawn, "s"),
            Row("launch", "lu.launch / mp.spawn", compare(ours, spawn), "ratio", "target <= 0.05"),
            Row("launch", "stop to every rank ended and reaped, 2 sleeping ranks", shutdown,
                "s", "target < 2")]


def _sleep_after_barrier(rank, world_size, flag_dir):
    import torch.distributed as dist
    dist.barrier()
    open(os.path.join(flag_dir, f"rank{rank}"), "w").close()
    time.sleep(600)


def _shutdown_seconds():
    """Seconds from ``stop_all()`` (a panel's Stop) until ``launch`` has raised, which it does
    only once every rank is dead and reaped."""
    import threading

    stopped_at = []
    with tempfile.TemporaryDirectory() as d:
        def stop_when_running():
            while len(os.listdir(d)) < 2:
                time.sleep(0.01)
            stopped_at.append(time.perf_counter())
            stop_all()
        thread = threading.Thread(target=stop_when_running, daemon=True)
        thread.start()
        try:
            launch(_sleep_after_barrier, d, world_size=2, timeout=120)
        except LaunchStopped:
            pass
        ended = time.perf_counter()
        thread.join()
    return ended - stopped_at[0]
