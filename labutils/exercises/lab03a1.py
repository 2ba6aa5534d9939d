"""Exercise checkers of lab 03a: ring all-reduce from send/recv. Registered in
``labutils.course``; notebooks call them as ``lu.check_<name>``.

Results alone do not make a ring: ``dist.all_reduce`` or a root-based answer sums correctly
too. So the checker also traces the messages at the dispatcher (``count_collectives``), and
runs one tensor large enough that gloo's blocking send waits for its receiver: a ring of
blocking sends then deadlocks, however small tensors behave."""
import torch

from labutils.core.commcount import count_collectives
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


def _traced_harness(rank, world_size, learner_fn, seed, n, dtype):
    with count_collectives() as counted:
        _run_learner(learner_fn, _rank_tensor(seed, rank, n, dtype))
    return [(c.op, c.peer) for c in counted.calls]


_DIST_NAMES = {"allreduce_": "dist.all_reduce", "broadcast_": "dist.broadcast",
               "allgather_": "dist.all_gather", "reduce_": "dist.reduce",
               "reduce_scatter_": "dist.reduce_scatter"}


def _not_a_ring(learner_fn, timeout, world_size=4, n=24):
    """What the answer's messages show that results cannot: a collective called, or every
    message going to or from one root. None when neither (the ring; recursive doubling)."""
    try:
        calls = launch(_traced_harness, learner_fn, 0, n, "float32", world_size=world_size,
                       timeout=timeout, threads_per_rank=1, warn_oversubscription=False)
    except Exception:  # noqa: BLE001 (it ran correctly just before: judged on its results)
        return None
    collectives = sorted({_DIST_NAMES.get(op, op.strip("_"))
                          for rank_calls in calls for op, _ in rank_calls
                          if op not in ("send", "recv_", "recv_any_source_", "barrier")})
    if collectives:
        return tr("the answer calls the collective(s) {ops}: build the all-reduce from "
                  "point-to-point messages only (dist.send/isend and dist.recv/irecv)",
                  ops=", ".join(collectives))
    links = {(src, dst) for src, rank_calls in enumerate(calls) for op, dst in rank_calls
             if op == "send"}
    for root in range(world_size):
        if links and all(root in link for link in links):
            return tr("every message goes to or from rank {root}: that is a reduce onto a root "
                      "and a broadcast, whose root carries (p - 1) whole tensors each way; in a "
                      "ring each rank sends only to its right neighbour", root=root)
    return None


def check_ring_all_reduce(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(tensor)``: afterwards every rank's ``tensor`` is the sum over ranks,
    for world sizes 2, 3 and 4 and lengths shorter than, equal to and not divisible by them, and
    one of 2^20 elements; then its messages are traced on 4 ranks (no collective, no root). A
    wrong answer's message also names the mistake when it is a typical one."""
    cases = make_cases(world_sizes=(2, 3, 4), per_world_size=2, seed=3, n=[1, 5, 7, 10, 13],
                       dtype=["float32", "float64", "int64"])
    # 2 MiB messages: more than any socket buffer holds, so a send blocks until received
    cases.append({"world_size": 2, "n": 1 << 20, "dtype": "float32", "seed": 1})
    result = run_check("ring_all_reduce", learner_fn, _ring_all_reduce_harness, cases,
                       timeout=timeout)
    if result.passed:
        meaning = _not_a_ring(learner_fn, timeout)
        if meaning is None:
            return result
        return type(result)(False, tr("[wrong] ring_all_reduce: every result is right, but "
                                      "{meaning}", meaning=meaning), None)
    if result.case is None:   # a stub: nothing to diagnose
        return result
    if tr("waiting in dist.{fn}", fn="send") in result.message:
        return type(result)(False, result.message + "; " + tr(
            "a blocking dist.send waits until its receiver posts the matching recv: when every "
            "rank sends first and receives after, they all wait forever; post the send with "
            "dist.isend, then recv, then wait on the send"), result.case)
    meaning = _diagnose(learner_fn, result.case, timeout)
    if meaning is None:
        return result
    return type(result)(False, f"{result.message}; {meaning}", result.case)
