"""Exercise checkers of lab 07: the ring all-reduce time; ZeRO memory per GPU (and exercise 3's
reference, ``tp_or_pp``). Registered in ``labutils.course``; notebooks call
them as ``lu.check_<name>``."""
import dataclasses

from labutils.cost import planner as pl
from labutils.cost import published as pub
from labutils.cost.costmodel import allreduce_time, ring_allreduce_time  # noqa: F401 (the reference)
from labutils.cost.planspec import zero_memory_per_gpu
from labutils.exercises.base import make_cases, run_check


def _ring_time_harness(rank, world_size, learner_fn, seed):
    """On each real rank, with p = this launch's world size: the learner's time vs ours."""
    import random
    rng = random.Random(seed * 31 + rank)
    nbytes = rng.choice([1 << 10, 1 << 20, 3 * (1 << 20), 1 << 26])
    alpha, beta = rng.choice([1e-6, 2e-5, 5e-5]), 1 / rng.choice([1.25e9, 1.25e10, 3e11])
    case = f"nbytes={nbytes}, world_size={world_size}, alpha={alpha:g}, beta={beta:g}"
    expected = {case: allreduce_time(nbytes, world_size, alpha, beta, "ring")}
    got = {case: learner_fn(nbytes, world_size, alpha, beta)}
    return expected, got


def check_ring_allreduce_time(learner_fn, *, timeout=30.0):
    """Check ``learner_fn(nbytes, world_size, alpha, beta)`` against the ring closed form,
    on real ranks of several world sizes (p is the launch's world size)."""
    cases = make_cases(world_sizes=(2, 3, 4), per_world_size=1, seed=7)
    return run_check("ring_allreduce_time", learner_fn, _ring_time_harness, cases,
                     timeout=timeout, atol=0.0, rtol=1e-6)


def _zero_memory_harness(rank, world_size, learner_fn, seed):
    """Each rank checks one stage with Nd = this launch's world size (stage = rank % 4)."""
    import random
    rng = random.Random(seed)
    num_params = rng.choice([7.5e9, 1.3e9, 175e9, 1e6])
    stages = [rank % 4] if world_size >= 4 else [rank % 4, (rank + 2) % 4]
    expected, got = {}, {}
    for stage in stages:
        key = f"num_params={num_params:g}, world_size={world_size}, stage={stage}"
        expected[key] = zero_memory_per_gpu(num_params, world_size, stage)
        got[key] = learner_fn(num_params, world_size, stage)
    return expected, got


def check_zero_memory_per_gpu(learner_fn, *, timeout=30.0):
    """Check ``learner_fn(num_params, world_size, stage)`` -> bytes per GPU for ZeRO 0-3."""
    cases = make_cases(world_sizes=(2, 4), per_world_size=1, seed=3)
    return run_check("zero_memory_per_gpu", learner_fn, _zero_memory_harness, cases,
                     timeout=timeout, atol=0.0, rtol=1e-9)


def tp_or_pp(hardware="A100-80GB"):
    """Reference of exercise 3: GPT 310.1B on 1,920 A100s (Narayanan et al.'s row, batch 2160,
    full recomputation), three ways to split the 1,920 GPUs; per layout its model TFLOP/s per
    GPU, whether it fits, and its terms (seconds per step). One schedule for all: 1F1B,
    not interleaved (72 micro-batches per pipeline at dp 30 are no multiple of 16)."""
    row = next(r for r in pub.narayanan2021() if r["params_billion"] == 310.1)
    out = {}
    for dp, tp, pp in ((30, 4, 16), (15, 8, 16), (15, 16, 8)):
        layout = dataclasses.replace(row["layout"], dp=dp, tp=tp, pp=pp, virtual_stages=1)
        pred = pl.predict(row["model"], layout, row["batch_size"], hardware, recompute="full")
        out[f"dp{dp} tp{tp} pp{pp}"] = (round(pred.tflops_per_gpu, 1), pred.fits,
                                        {k: round(v, 2) for k, v in pred.terms.items() if v})
    return out
