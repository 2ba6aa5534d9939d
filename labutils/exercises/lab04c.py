"""Exercise checkers of lab 04c: bus bandwidth. Registered in ``labutils.course``; notebooks call
them as ``lu.check_<name>``."""
from labutils.cost.costmodel import bus_bandwidth
from labutils.exercises.base import make_cases, run_check


def _bus_bandwidth_harness(rank, world_size, learner_fn, seed):
    import random


    rng = random.Random(seed * 10 + rank)
    cases = [(rng.choice([1 << 10, 1 << 20, 64 << 20]), rng.uniform(1e-4, 0.5), world_size)
             for _ in range(3)]
    expected = [bus_bandwidth(*c) for c in cases]
    got = [learner_fn(*c) for c in cases]
    return expected, got


def check_bus_bandwidth(learner_fn, *, timeout=30.0):
    """Check ``learner_fn(nbytes, seconds, world_size) -> bytes/s``: an all-reduce's bus
    bandwidth, the figure comparable across world sizes and with a link's speed."""
    cases = make_cases(world_sizes=(2, 3, 4), per_world_size=1, seed=2)
    return run_check("bus_bandwidth", learner_fn, _bus_bandwidth_harness, cases,
                     timeout=timeout, rtol=1e-6)
