"""Exercise checker of lab 03a1 (``03a1_collectives_and_ring``): a ring all-reduce from
send/recv. Registered in ``labutils.course``; the notebook calls ``lu.check_ring_all_reduce``.

Results alone do not make a ring: ``dist.all_reduce``, a root-based answer and recursive
doubling all sum correctly. So after the result cases the checker runs one more, traced: every
send and receive each rank issues is recorded at the dispatcher (``count_collectives``), and a
ring is what calls no collective, puts no rank at the centre, sends and receives exactly
2 (p-1)/p of the tensor on every rank, and sends to one neighbour, around one cycle. That case
is large (2^20 float32 on 4 ranks) so that a ring of blocking sends deadlocks there even on a
gloo whose small sends do not wait: on this PyTorch's gloo (tcp) a blocking ``dist.send`` waits
for the matching recv at every size (measured: 1 element and 2^20 both deadlock), so the first
result case already shows it."""
import torch

from labutils.core.commcount import count_collectives
from labutils.core.errors import LaunchTimeout, WorkerError
from labutils.core.i18n import language, tr
from labutils.core.launcher import launch
from labutils.exercises.base import (_describe_case, _describe_error, _in_language,
                                     first_difference, make_cases, run_check)
from labutils.parallel.collectives import ring_all_reduce  # noqa: F401 (the reference)

# The traced case: chunks of n/p divide evenly, so every rank's bytes are exact; 4 MiB.
TRACED = {"world_size": 4, "n": 1 << 20, "dtype": "float32", "seed": 1}
_POINT_TO_POINT = ("send", "recv_", "recv_any_source_")
_DIST_NAMES = {"allreduce_": "dist.all_reduce", "broadcast_": "dist.broadcast",
               "allgather_": "dist.all_gather", "reduce_": "dist.reduce",
               "reduce_scatter_": "dist.reduce_scatter"}


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


def _expected(seed, world_size, n, dtype):
    """The reference, in one process, from every rank's rebuilt tensor (summed in float64)."""
    return sum(_rank_tensor(seed, r, n, dtype).double() for r in range(world_size))


def _ring_all_reduce_harness(rank, world_size, learner_fn, seed, n, dtype):
    got = _run_learner(learner_fn, _rank_tensor(seed, rank, n, dtype))
    return _expected(seed, world_size, n, dtype).to(got.dtype), got


def _results_harness(rank, world_size, learner_fn, seed, n, dtype):
    return _run_learner(learner_fn, _rank_tensor(seed, rank, n, dtype))


def _traced_harness(rank, world_size, learner_fn, seed, n, dtype):
    """(first difference from the sum or None, [(op, peer, bytes)] of every call this rank
    issued). The tensor stays on its rank: 4 MiB per rank need not travel back."""
    x = _rank_tensor(seed, rank, n, dtype)
    with count_collectives() as counted:
        got = _run_learner(learner_fn, x)
    diff = first_difference(_expected(seed, world_size, n, dtype).to(got.dtype), got)
    return diff, [(c.op, c.peer, c.nbytes) for c in counted.calls]


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
    chunks = [x.tensor_split(p) for x in inputs]
    for rank, g in enumerate(got):
        right = [k for k, (a, b) in enumerate(zip(g.tensor_split(p), total.tensor_split(p)))
                 if a.numel() and _same(a, b)]
        if right and len(right) < sum(1 for c in total.tensor_split(p) if c.numel()):
            return tr("rank {rank} holds the full sum in chunk(s) {right} only: that is where a "
                      "reduce-scatter ends; p - 1 all-gather steps must then pass each finished "
                      "chunk around the ring", rank=rank, right=right)
    # every chunk on every rank is one rank's own values: received, but never added
    if all(any(_same(a, c[k]) for c in chunks)
           for g in got for k, a in enumerate(g.tensor_split(p)) if a.numel()):
        return tr("every chunk holds one rank's values, not a sum: in each reduce-scatter step "
                  "add the incoming chunk to yours (+=), do not overwrite it")
    return None


def _all_in_send(stuck, world_size):
    """Every rank waits in a blocking dist.send: a cycle of sends, none of them received."""
    waiting = tr("waiting in dist.{fn}", fn="send")
    return len(stuck) == world_size and all(waiting in s for s in stuck)


def _sends_first():
    return tr("every rank sends before it receives: a blocking dist.send waits until its "
              "receiver posts the matching recv, so around a ring every rank waits forever; "
              "post the send with dist.isend (then recv, then wait on the send), or order by "
              "rank parity (even ranks send first, odd ranks receive first)")


def _timed_out(message, timeout):
    """Whether run_check's message is its timeout's (the words between its placeholders)."""
    words = tr("{where}: did not finish in {timeout:g} s (deadlock?): {stuck}", where="\0",
               timeout=timeout, stuck="\0").split("\0")
    return any(w.strip() and w in message for w in words)


def _not_a_ring(calls, world_size, nbytes):
    """What the traced messages show that results cannot: a collective called, everything
    through one root, bytes per rank other than the ring's, or more than one peer per rank.
    None for a ring (either direction)."""
    collectives = sorted({_DIST_NAMES.get(op, op.strip("_"))
                          for rank_calls in calls for op, _, _ in rank_calls
                          if op not in _POINT_TO_POINT and op != "barrier"})
    if collectives:
        return tr("the answer calls the collective(s) {ops}: build the all-reduce from "
                  "point-to-point messages only (dist.send/isend and dist.recv/irecv)",
                  ops=", ".join(collectives))
    links = {(src, dst) for src, rank_calls in enumerate(calls) for op, dst, _ in rank_calls
             if op == "send"}
    for root in range(world_size):
        if links and all(root in link for link in links):
            return tr("every message goes to or from rank {root}: that is a reduce onto a root "
                      "and a broadcast, whose root carries (p - 1) whole tensors each way; in a "
                      "ring each rank sends only to its right neighbour", root=root)
    ring = 2 * (world_size - 1) * nbytes // world_size   # 2 (p-1)/p n, exact: p divides n
    for rank, rank_calls in enumerate(calls):
        sent = sum(b for op, _, b in rank_calls if op == "send")
        received = sum(b for op, _, b in rank_calls if op in _POINT_TO_POINT[1:])
        if sent != ring or received != ring:
            return tr("rank {rank} sends {sent} bytes and receives {received}, where a ring "
                      "sends and receives 2 (p - 1)/p n = {ring} bytes on every rank (p = {p}, "
                      "n = {n} bytes): send one chunk of n/p per step, 2 (p - 1) steps, not the "
                      "whole tensor (recursive doubling and trees send whole tensors)",
                      rank=rank, sent=sent, received=received, ring=ring, p=world_size,
                      n=nbytes)
    # the ring's own shape: one successor per rank, and following them visits every rank
    peers = [sorted({dst for op, dst, _ in rank_calls if op == "send"}) for rank_calls in calls]
    for rank, to in enumerate(peers):
        if len(to) != 1:
            return tr("rank {rank} sends to ranks {peers}: in a ring every rank sends to one "
                      "neighbour only (the right one, or the left one throughout); swapping "
                      "with partners at distances 1, 2, 4, ... is halving-doubling",
                      rank=rank, peers=to)
    rank, seen = 0, set()
    while rank not in seen:
        seen.add(rank)
        rank = peers[rank][0]
    if len(seen) != world_size:
        return tr("the ranks' messages form cycles of {length} ranks, not one ring through "
                  "all {p}: send to rank + 1 (or rank - 1) modulo p", length=len(seen),
                  p=world_size)
    return None


def _traced_case(learner_fn, where, timeout):
    """The traced case: None when it is a ring, else the message."""
    p, seed, n, dtype = (TRACED[k] for k in ("world_size", "seed", "n", "dtype"))
    try:
        traced = launch(_in_language, language(), _traced_harness, learner_fn, seed=seed, n=n,
                        dtype=dtype, world_size=p, timeout=timeout, threads_per_rank=1,
                        warn_oversubscription=False)
    except LaunchTimeout as e:
        message = tr("{where}: did not finish in {timeout:g} s (deadlock?): {stuck}",
                     where=where, timeout=timeout, stuck="; ".join(e.stuck))
        return message + ("; " + _sends_first() if _all_in_send(e.stuck, p) else "")
    except WorkerError as e:
        return f"{where}: {_describe_error(e)}"
    for rank, (diff, _) in enumerate(traced):
        if diff is not None:
            return tr("{where}: rank {rank}, {diff}", where=where, rank=rank, diff=diff)
    meaning = _not_a_ring([calls for _, calls in traced], p, n * 4)
    if meaning is None:
        return None
    return tr("[wrong] ring_all_reduce: every result is right, but {meaning}", meaning=meaning)


def check_ring_all_reduce(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(tensor)``: afterwards every rank's ``tensor`` is the sum over ranks,
    for world sizes 2, 3 and 4 and lengths shorter than, equal to and not divisible by them;
    then on 4 ranks and 2^20 elements, with every message traced: no collective, no root,
    2 (p-1)/p of the tensor sent and received by every rank, each sending to one neighbour
    around one cycle. A wrong answer's message also names the mistake when it is a typical
    one."""
    cases = make_cases(world_sizes=(2, 3, 4), per_world_size=2, seed=3, n=[1, 5, 7, 10, 13],
                       dtype=["float32", "float64", "int64"])
    total = len(cases) + 1
    result = run_check("ring_all_reduce", learner_fn, _ring_all_reduce_harness, cases,
                       timeout=timeout)
    if result.passed:
        where = tr("[wrong] {name}: case {number} of {total} ({case})", name="ring_all_reduce",
                   number=total, total=total,
                   case=_describe_case(TRACED))
        message = _traced_case(learner_fn, where, timeout)
        if message is not None:
            return type(result)(False, message, TRACED)
        return type(result)(True, tr("[ok] {name}: {passed} (world sizes {sizes})",
                                     name="ring_all_reduce",
                                     passed=tr("{total} cases passed", total=total),
                                     sizes="2, 3, 4"))
    if result.case is None:   # a stub: nothing to diagnose
        return result
    if result.message.count(tr("waiting in dist.{fn}", fn="send")) == result.case["world_size"]:
        return type(result)(False, result.message + "; " + _sends_first(), result.case)
    if _timed_out(result.message, timeout):   # another deadlock: its stacks say where
        return result
    if "IndexError" in result.message:
        return type(result)(False, result.message + "; " + tr(
            "tensor.chunk(p) returns fewer than p chunks when the length is shorter than p or "
            "not divisible by it; tensor.tensor_split(p) always returns p"), result.case)
    meaning = _diagnose(learner_fn, result.case, timeout)
    if meaning is None:
        return result
    return type(result)(False, f"{result.message}; {meaning}", result.case)
