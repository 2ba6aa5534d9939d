"""Benchmarks: ``python -m labutils.bench NAME [--quick]`` (``make bench`` runs ``all``).

Each benchmark is a function ``bench_<name>(quick) -> list[Row]`` registered in BENCHMARKS; a
row is one headline figure, measured as a ratio side by side in the same run (median, min, max
of interleaved repeats), because a 2-core shared machine is too noisy for absolute times.
Speed targets live here, never in timed tests.
"""
from __future__ import annotations

import argparse
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
    "collectives": "labutils.collectives:bench_collectives",
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
    return [Row("launch", "warm lu.launch, 2 ranks, 1 all-reduce", ours, "s"),
            Row("launch", "torch.multiprocessing.spawn, same job", spawn, "s"),
            Row("launch", "lu.launch / mp.spawn", ours / spawn, "ratio", "target <= 0.05")]


# ---- command line -----------------------------------------------------------------------

def run(names, quick=False, out_dir=None):
    rows = []
    for name in names:
        module, func = BENCHMARKS[name].split(":")
        t0 = time.perf_counter()
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows += getattr(importlib.import_module(module), func)(quick=quick)
        print(f"  {name} took {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m labutils.bench", description=__doc__)
    parser.add_argument("names", nargs="*", default=["all"],
                        help=f"one or more of: all, {', '.join(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="one repeat each (checks it runs)")
    args = parser.parse_args(argv)
    names = list(BENCHMARKS) if args.names in (["all"], []) else args.names
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from all, {', '.join(BENCHMARKS)}")
    rows = run(names, quick=args.quick)
    print(markdown_table(rows))
    return rows


if __name__ == "__main__":
    main()
