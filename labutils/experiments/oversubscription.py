"""More ranks than cores: what a rank's fixed work per step costs as the ranks grow.

Used by ``03e2_hardware_constraints``. Every rank does the same fixed work per step (matrix
products on one thread) and ends the step with a small all-reduce, as a data-parallel step
does. Each rank times itself: the compute of each step, and the whole step (compute plus the
all-reduce, which waits for the slowest rank). The launch (process start, process group, exit)
is timed apart, by the caller, so it never pollutes the per-step figures.

Rounds are interleaved over the world sizes (1, 2, 4, 1, 2, 4, ...) so that noise from other
jobs on the machine hits every world size alike; each figure is a ``Stats`` over the rounds.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from labutils.core.launcher import launch
from labutils.core.rank import progress
from labutils.core.timing import Stats


def fixed_work_worker(rank, world_size, steps=13, warmup=3, n=160):
    """Time ``steps`` steps of fixed work inside this rank; the first ``warmup`` are dropped.
    Returns {"compute": seconds per step, "step": seconds per step including the all-reduce}."""
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(rank))
    compute, step = [], []
    for i in range(steps):
        t0 = time.perf_counter()
        for _ in range(10):
            a = torch.tanh(a @ a / n)
        t1 = time.perf_counter()
        dist.all_reduce(torch.ones(4))   # the step ends when the slowest rank arrives
        t2 = time.perf_counter()
        if i >= warmup:
            compute.append(t1 - t0)
            step.append(t2 - t0)
    return {"compute": compute, "step": step}


def measure_oversubscription(world_sizes=(1, 2, 4), rounds=5, steps=13, warmup=3):
    """Per world size: ``Stats`` over ``rounds`` of the median compute time per step (slowest
    rank), the median step time (slowest rank) and the launch's wall time, and the number of
    steps each rank timed. Launches with more ranks than cores warn, as every launch does."""
    if steps <= warmup:
        raise ValueError(f"steps={steps} must exceed warmup={warmup}")
    samples = {p: {"compute": [], "step": [], "launch": [], "timed_steps": set()}
               for p in world_sizes}
    for r in range(rounds):
        for p in world_sizes:
            t0 = time.perf_counter()
            per_rank = launch(fixed_work_worker, steps, warmup, world_size=p,
                              threads_per_rank=1)
            samples[p]["launch"].append(time.perf_counter() - t0)
            for key in ("compute", "step"):
                samples[p][key].append(max(statistics.median(x[key]) for x in per_rank))
            samples[p]["timed_steps"].update(len(x["step"]) for x in per_rank)
        progress(r + 1, rounds, "rounds")
    return {p: {"compute": Stats.of(s["compute"]), "step": Stats.of(s["step"]),
                "launch": Stats.of(s["launch"]), "timed_steps": sorted(s["timed_steps"])}
            for p, s in samples.items()}
