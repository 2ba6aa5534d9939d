"""Exercise checkers of lab 03a: ring all-reduce from send/recv. Registered in ``labutils.course``; notebooks call
them as ``lu.check_<name>``."""
import torch

from labutils.core.i18n import tr
from labutils.core.launcher import launch
from labutils.exercises.base import make_cases, run_check
from labutils.parallel.collectives import ring_all_reduce  # noqa: F401 (the reference)


def _rank_tensor(seed, rank, n, dtype):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype == "int64":
        return torch.randint(-100, 100, (n,), generator=g)
    return torch.randn(n, generator=g).to(getattr(torch, dtype))


def _run_learner(learner_fn, x):
    out = learner_fn(x)
    if out is not None and isinstance(out, torch.Tensor) and out.data_ptr() != x.data_ptr():
        return out  # accept a function that returns the result, as long as it is right
    return x


def _ring_all_reduce_harness(rank, world_size, learner_fn, seed, n, dtype):
    # The reference is computed here, in one process, from every rank's rebuilt tensor.
    expected = sum(_rank_tensor(seed, r, n, dtype).double() for r in range(world_size))
    got = _run_learner(learner_fn, _rank_tensor(seed, rank, n, dtype))
    return expected.to(got.dtype), got


def _results_harness(rank, world_size, learner_fn, seed, n, dtype):
    return _run_learner(learner_fn, _rank_tensor(seed, rank, n, dtype))


def _same(a, b):
    return torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-4)


def _diagnose(learner_fn, case, timeout):
    """What a wrong answer did, from every rank's result on the failing case (run once more)."""
    p, seed, n, dtype = case["world_size"], case["seed"], case["n"], case["dtype"]
    try:
        got = launch(_results_harness, learner_fn, seed, n, dtype, world_size=p, timeout=timeout,
                     threads_per_rank=1, warn_oversubscription=False)
    except Exception:  # noqa: BLE001 (a crash or a deadlock is already named by the check)
        return None
    inputs = [_rank_tensor(seed, r, n, dtype) for r in range(p)]
    total = sum(x.double() for x in inputs)
    if not all(isinstance(g, torch.Tensor) and g.shape == total.shape for g in got):
        return None
    if all(_same(g, x) for g, x in zip(got, inputs)):
        return tr("every rank's tensor is unchanged: write the sum into `tensor` itself, in "
                  "place")
    mean = total.div(p, rounding_mode="floor") if dtype == "int64" else total / p
    if all(_same(g, mean) for g in got):
        return tr("every rank holds the mean: an all-reduce sums, do not divide by the world "
                  "size")
    for rank, g in enumerate(got):
        right = [k for k, (a, b) in enumerate(zip(g.tensor_split(p), total.tensor_split(p)))
                 if a.numel() and _same(a, b)]
        if right and len(right) < sum(1 for c in total.tensor_split(p) if c.numel()):
            return tr("rank {rank} holds the full sum in chunk(s) {right} only: that is where a "
                      "reduce-scatter ends; p - 1 all-gather steps must then pass each finished "
                      "chunk around the ring", rank=rank, right=right)
    return None


def check_ring_all_reduce(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(tensor)``: afterwards every rank's ``tensor`` is the sum over ranks,
    for world sizes 2, 3 and 4 and lengths shorter than, equal to and not divisible by them.
    A wrong answer's message also names the mistake when it is a typical one."""
    cases = make_cases(world_sizes=(2, 3, 4), per_world_size=2, seed=3, n=[1, 5, 7, 10, 13],
                       dtype=["float32", "float64", "int64"])
    result = run_check("ring_all_reduce", learner_fn, _ring_all_reduce_harness, cases,
                       timeout=timeout)
    if result.passed or result.case is None:   # passed, or a stub: nothing to diagnose
        return result
    meaning = _diagnose(learner_fn, result.case, timeout)
    if meaning is None:
        return result
    return type(result)(False, f"{result.message}; {meaning}", result.case)
