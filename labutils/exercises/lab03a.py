"""Exercise checkers of lab 03a: ring all-reduce from send/recv. Registered in ``labutils.course``; notebooks call
them as ``lu.check_<name>``."""
import torch

from labutils.exercises.base import make_cases, run_check
from labutils.parallel.collectives import ring_all_reduce  # noqa: F401 (the reference)


def _rank_tensor(seed, rank, n, dtype):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype == "int64":
        return torch.randint(-100, 100, (n,), generator=g)
    return torch.randn(n, generator=g).to(getattr(torch, dtype))


def _ring_all_reduce_harness(rank, world_size, learner_fn, seed, n, dtype):
    # The reference is computed here, in one process, from every rank's rebuilt tensor.
    expected = sum(_rank_tensor(seed, r, n, dtype).double() for r in range(world_size))
    got = _rank_tensor(seed, rank, n, dtype)
    out = learner_fn(got)
    if out is not None and out is not got and out.data_ptr() != got.data_ptr():
        got = out  # accept a function that returns the result, as long as it is right
    return expected.to(got.dtype), got


def check_ring_all_reduce(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(tensor)``: afterwards every rank's ``tensor`` is the sum over ranks,
    for world sizes 2, 3 and 4 and lengths shorter than, equal to and not divisible by them."""
    cases = make_cases(world_sizes=(2, 3, 4), per_world_size=2, seed=3, n=[1, 5, 7, 10, 13],
                       dtype=["float32", "float64", "int64"])
    return run_check("ring_all_reduce", learner_fn, _ring_all_reduce_harness, cases,
                     timeout=timeout)
