"""Benchmarks: ``python -m labutils.bench NAME [--quick]`` (``make bench`` runs ``all``).

Each benchmark is a function ``bench_<name>(quick) -> list[Row]`` registered in BENCHMARKS; a
row is one headline figure, measured as a ratio side by side in the same run (median, min, max
of interleaved repeats), because a 2-core shared machine is too noisy for absolute times.
Speed targets live here, never in timed tests.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass

from .timing import Stats, interleaved

# name -> "module:function"; each lab adds its own line.
BENCHMARKS = {
    "launch": "labutils.bench:bench_launch",
    "pipeline": "labutils.pipeline:bench_pipeline",
    "collectives": "labutils.collectives:bench_collectives",
    "costmodel": "labutils.bench:bench_costmodel",
    "ddp": "labutils.profile:bench_ddp",
    "zero": "labutils.sharding:bench_zero",
    "emulated_ddp": "labutils.emulated_ddp:bench_emulated_ddp",
}


@dataclass
class Row:
    benchmark: str
    figure: str
    value: Stats | float | str
    unit: str = ""
    note: str = ""

    def cells(self):
        v = self.value
        if isinstance(v, Stats):
            value = f"{v.median:.4g} (min {v.min:.4g}, max {v.max:.4g})"
        elif isinstance(v, float):
            value = f"{v:.4g}"
        else:
            value = str(v)
        return [self.benchmark, self.figure, value, self.unit, self.note]

    def as_dict(self):
        v = self.value
        value = ({"median": v.median, "min": v.min, "max": v.max, "n": v.n}
                 if isinstance(v, Stats) else v)
        return {"benchmark": self.benchmark, "figure": self.figure, "value": value,
                "unit": self.unit, "note": self.note}


def markdown_table(rows):
    head = ["benchmark", "figure", "value (median, min, max)", "unit", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)


# ---- launch: warm lu.launch vs torch.multiprocessing.spawn ------------------------------

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
    dist.barrier()   # leave together (see labutils.run): no rank closes gloo under a peer
    dist.destroy_process_group()


def _spawn_job(world_size=2):
    import torch.multiprocessing as tmp
    with tempfile.TemporaryDirectory() as d:  # file rendezvous: no port to collide on
        tmp.spawn(_spawn_worker, args=(world_size, os.path.join(d, "init")),
                  nprocs=world_size, join=True)


def bench_launch(quick=False):
    """Warm 2-rank launch doing one all-reduce vs the same job under mp.spawn."""
    from .launcher import launch
    launch(_one_allreduce, world_size=2)  # pay the forkserver's torch import once
    stats = interleaved({"lu.launch": lambda: launch(_one_allreduce, world_size=2),
                         "mp.spawn": _spawn_job},
                        repeats=1 if quick else 5, warmup=0)
    ours, spawn = stats["lu.launch"], stats["mp.spawn"]
    shutdown = Stats.of([_shutdown_seconds() for _ in range(1 if quick else 5)])
    return [Row("launch", "warm lu.launch, 2 ranks, 1 all-reduce", ours, "s"),
            Row("launch", "torch.multiprocessing.spawn, same job", spawn, "s"),
            Row("launch", "lu.launch / mp.spawn", ours / spawn, "ratio", "target <= 0.05"),
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

    from .launcher import LaunchStopped, launch, stop_all
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


# ---- costmodel: alpha-beta fitted here predicts gloo all-reduce; emulated link accuracy ----

def _allreduce_sweep(rank, world_size, sizes, repeats, link, per_sample=0.03):
    """Seconds per gloo all-reduce, per size: each sample is the mean of back-to-back calls
    filling about ``per_sample`` seconds (as nccl-tests times a loop of iterations: one call
    after a barrier mostly measures which rank left the barrier last). The same for the
    all-reduce emulated on ``link``. Sizes and plain/emulated are interleaved."""
    import torch
    import torch.distributed as dist

    from . import costmodel as cm
    bufs = {n: torch.ones(n // 4) for n in sizes}
    plain = {n: [] for n in sizes}
    emulated = {n: [] for n in sizes}
    emulator = cm.emulate(link)
    calls = {}
    for n in sizes:  # warm-up (gloo sets up its buffers on the first call of each size) and
        dist.barrier()  # a first timing that sets how many calls fill one sample
        t0 = time.perf_counter()
        for _ in range(3):
            dist.all_reduce(bufs[n])
        once = torch.tensor([(time.perf_counter() - t0) / 3])
        dist.all_reduce(once, op=dist.ReduceOp.MAX)   # every rank must make the same calls
        calls[n] = max(1, min(50, round(per_sample / once.item())))
    for _ in range(repeats):
        for n in sizes:
            for times, ctx in ((plain, None), (emulated, emulator)):
                k = calls[n] if ctx is None else 1   # an emulated call is long already
                with ctx or contextlib.nullcontext():
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(k):
                        dist.all_reduce(bufs[n])
                    times[n].append((time.perf_counter() - t0) / k)
    return plain, emulated


def allreduce_fit(sizes, repeats, link="1GbE"):
    """gloo's all-reduce on 2 real ranks (``_allreduce_sweep``; per sample the slowest rank),
    alpha-beta fitted on the even repeats of the sizes >= 1 MiB. Returns ``(plain, emulated,
    alpha, beta, held_out)``: ``held_out(n)`` is the Stats of measured / predicted over the odd
    repeats of size ``n``, which the fit never saw."""
    from . import costmodel as cm
    from .launcher import launch
    from .timing import slowest
    per_rank = launch(_allreduce_sweep, sizes, repeats, link, world_size=2)
    plain, emulated = ({n: slowest([r[i][n] for r in per_rank]) for n in sizes} for i in (0, 1))
    # Fit on the range the target covers (>= 1 MiB): below it gloo's time on loopback is
    # nearly flat (thread wake-ups), and one alpha-beta line cannot follow both regimes.
    fit_sizes = [n for n in sizes if n >= 1 << 20]
    alpha, beta = cm.fit(fit_sizes, [Stats.of(plain[n][0::2]) for n in fit_sizes], 2)

    def held_out(n):
        predicted = cm.allreduce_time(n, 2, alpha, beta)
        return Stats.of([t / predicted for t in plain[n][1::2]])
    return plain, emulated, alpha, beta, held_out


def bench_costmodel(quick=False):
    """Fit alpha-beta on half of the repeats, predict the other half; emulated 1GbE vs model."""
    from . import costmodel as cm
    KiB, MiB = 1 << 10, 1 << 20
    sizes = [64 * KiB, MiB, 4 * MiB] if quick else [4 * KiB, 64 * KiB, 256 * KiB, MiB, 2 * MiB,
                                                    4 * MiB, 16 * MiB]
    plain, emulated, alpha, beta, held_out = allreduce_fit(sizes, 2 if quick else 16)
    rows = [Row("costmodel", "fitted alpha (2 ranks, gloo, loopback)", alpha * 1e6, "us",
                "fit on the sizes >= 1 MiB, even repeats"),
            Row("costmodel", "fitted bandwidth 1/beta", 1e-9 / beta if beta else float("inf"),
                "GB/s")]
    for n in sizes:
        label = f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"
        rows.append(Row("costmodel", f"all-reduce {label}: measured / predicted", held_out(n),
                        "ratio", "held-out repeats; target within 15%" if n >= MiB else
                        "below the fitted range (no target)"))
    link = cm.get_link("1GbE")
    for n in sizes:
        if n < MiB:
            continue
        model = cm.allreduce_time(n, 2, link.alpha, link.beta)
        rows.append(Row("costmodel", f"emulated 1GbE all-reduce {n // MiB} MiB: measured / model",
                        Stats.of([t / model for t in emulated[n]]), "ratio",
                        f"model {model * 1e3:.3g} ms; target within 10%"))
    return rows


# ---- the machine, the suite, the files ---------------------------------------------------

def machine():
    """A one-line description of this machine: CPU, cores, memory, OS, Python, torch."""
    import platform

    import torch
    cpu = platform.machine()  # platform.processor() would start a `uname` process
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    try:
        import psutil
        mem = f", {psutil.virtual_memory().total / 2**30:.0f} GiB RAM"
    except ImportError:
        mem = ""
    gpu = (f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU")
    return (f"{cpu}, {cores} cores{mem}{gpu}; {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, torch {torch.__version__}")


def run(names, quick=False):
    """Rows of benchmarks ``names`` (see ``run_suite``)."""
    return run_suite(names, quick)[0]


def run_suite(names, quick=False):
    """(rows, seconds per benchmark); a failing benchmark becomes a FAILED row, the others
    still run."""
    rows, seconds = [], {}
    for name in names:
        module, func = BENCHMARKS[name].split(":")
        t0 = time.perf_counter()
        print(f"running {name} ...", file=sys.stderr, flush=True)
        try:
            rows += getattr(importlib.import_module(module), func)(quick=quick)
        except Exception as e:  # noqa: BLE001 - one broken lab must not hide the others
            rows.append(Row(name, "FAILED", f"{type(e).__name__}: {e}"[:200]))
        seconds[name] = time.perf_counter() - t0
        print(f"  {name} took {seconds[name]:.1f} s", file=sys.stderr, flush=True)
    return rows, seconds


def write_results(rows, seconds, out_dir, quick=False):
    """Write ``bench.md``, ``bench.json`` and ``README-snippet.md`` to ``out_dir``."""
    import datetime
    import json
    os.makedirs(out_dir, exist_ok=True)
    date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    desc = machine()
    mode = "quick (1-2 repeats: checks it runs)" if quick else "full"
    table = markdown_table(rows)
    total = sum(seconds.values())
    with open(os.path.join(out_dir, "bench.md"), "w") as f:
        f.write(f"# Benchmarks ({mode})\n\n{date}, {desc}; {total:.0f} s in all.\n\n{table}\n")
    with open(os.path.join(out_dir, "bench.json"), "w") as f:
        json.dump({"date": date, "machine": desc, "quick": quick, "seconds": seconds,
                   "rows": [r.as_dict() for r in rows]}, f, indent=1, default=str)
    with open(os.path.join(out_dir, "README-snippet.md"), "w") as f:
        f.write(f"### Latest benchmark\n\n`make bench` on {date}: {desc}. Each figure is a "
                f"ratio measured side by side in one run (median, min, max of interleaved "
                f"repeats).\n\n{table}\n")
    return out_dir


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m labutils.bench", description=__doc__)
    parser.add_argument("names", nargs="*", default=["all"],
                        help=f"one or more of: all, {', '.join(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="one repeat each (checks it runs)")
    parser.add_argument("--out", default="bench-results",
                        help="folder for bench.md, bench.json, README-snippet.md")
    args = parser.parse_args(argv)
    names = list(BENCHMARKS) if args.names in (["all"], []) else args.names
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from all, {', '.join(BENCHMARKS)}")
    rows, seconds = run_suite(names, quick=args.quick)
    write_results(rows, seconds, args.out, quick=args.quick)
    print(f"{machine()}\n")
    print(markdown_table(rows))
    print(f"\n{sum(seconds.values()):.0f} s; written to {args.out}/ (bench.md, bench.json, "
          f"README-snippet.md)", file=sys.stderr)
    return rows


if __name__ == "__main__":
    sys.exit(1 if any(r.figure == "FAILED" for r in main()) else 0)
