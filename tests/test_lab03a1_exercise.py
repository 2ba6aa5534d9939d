"""lab 03a1's checker: ``check_ring_all_reduce`` accepts the reference ring and rejects, each
with a message naming the mistake, what results alone would let through (``dist.all_reduce``,
a root, recursive doubling's whole tensors, halving-doubling's partners, a ring of blocking
sends) and the wrong sums."""
import pytest
import torch
import torch.distributed as dist

import labutils as lu
from labutils import collectives as C
from labutils.exercises import lab03a1 as exercises

from .checkers import assert_check, checker_cases

pytestmark = pytest.mark.lab03a1


def _ring(tensor, exchange):
    """The ring's two phases with ``exchange(send, dst, recv, src)`` for one message step;
    the mistakes below differ from the reference only where they say."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    chunks = list(tensor.view(-1).tensor_split(world_size))
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for step in range(world_size - 1):
        send, mine = chunks[(rank - step) % world_size], chunks[(rank - step - 1) % world_size]
        buf = torch.empty_like(mine)
        exchange(send, right, buf, left)
        mine += buf
    for step in range(world_size - 1):
        exchange(chunks[(rank + 1 - step) % world_size], right,
                 chunks[(rank - step) % world_size], left)
    return tensor


def _send_then_recv(send, dst, recv, src):
    if send.numel():
        dist.send(send.clone(), dst)
    if recv.numel():
        dist.recv(recv, src)


def _blocking_ring(tensor):
    """Typical mistake: blocking sends, every rank sending before it receives."""
    return _ring(tensor, _send_then_recv)


def _blocking_when_large(tensor):
    """A gloo whose small sends do not wait, emulated: blocking only from 2^16 elements, so only
    the traced case (2^20) can show the deadlock."""
    return _ring(tensor, _send_then_recv if tensor.numel() >= 1 << 16 else C._exchange)


def _gloo(tensor):
    """Not a ring: PyTorch's own all-reduce (right results)."""
    dist.all_reduce(tensor)


def _average(tensor):
    """Typical mistake (wrong division): divides the sum by the world size."""
    _ring(tensor, C._exchange)
    if tensor.is_floating_point():
        return tensor.div_(dist.get_world_size())
    return tensor.div_(dist.get_world_size(), rounding_mode="floor")


def _reduce_scatter_only(tensor):
    """Typical mistake: stops after the reduce-scatter (no all-gather)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    chunks = list(tensor.view(-1).tensor_split(world_size))
    for step in range(world_size - 1):
        send, mine = chunks[(rank - step) % world_size], chunks[(rank - step - 1) % world_size]
        buf = torch.empty_like(mine)
        C._exchange(send, (rank + 1) % world_size, buf, (rank - 1) % world_size)
        mine += buf
    return tensor


def _overwrites(tensor):
    """Typical mistake (missing reduction): copies the incoming chunk instead of adding it."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    chunks = list(tensor.view(-1).tensor_split(world_size))
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for step in range(2 * (world_size - 1)):
        C._exchange(chunks[(rank - step) % world_size].clone(), right,
                    chunks[(rank - step - 1) % world_size], left)
    return tensor


def _chunk(tensor):
    """Typical mistake: ``tensor.chunk(p)``, which may return fewer than p chunks."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    chunks = list(tensor.view(-1).chunk(world_size))
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for step in range(world_size - 1):
        mine = chunks[(rank - step - 1) % world_size]
        buf = torch.empty_like(mine)
        C._exchange(chunks[(rank - step) % world_size], right, buf, left)
        mine += buf
    for step in range(world_size - 1):
        C._exchange(chunks[(rank + 1 - step) % world_size], right,
                    chunks[(rank - step) % world_size], left)
    return tensor


def _not_in_place(tensor):
    """Typical mistake: sums into a copy and returns nothing."""
    C.ring_all_reduce(tensor.clone())


def _stub(tensor):
    raise NotImplementedError  # FILL ME IN


@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(C.ring_all_reduce, {
    "gloo": (_gloo, ("every result is right", "dist.all_reduce", "point-to-point")),
    "root": (C.root_all_reduce, ("every result is right", "to or from rank 0", "root")),
    "recursive_doubling": (C.recursive_doubling_all_reduce,
                           ("every result is right", "sends 8388608 bytes",
                            "2 (p - 1)/p n = 6291456", "whole tensor")),
    "halving_doubling": (C.halving_doubling_all_reduce,
                         ("every result is right", "sends to ranks [1, 2]", "halving-doubling")),
    "blocking_ring": (_blocking_ring, ("did not finish", "every rank sends before it receives",
                                       "dist.isend", "rank parity"), {"timeout": 8}),
    # the default timeout: six cases must finish before the seventh deadlocks
    "blocking_when_large": (_blocking_when_large, ("case 7 of 7", "did not finish",
                                                   "every rank sends before it receives")),
    "average": (_average, ("expected", "holds the mean", "do not divide")),
    "reduce_scatter_only": (_reduce_scatter_only, ("rank", "expected", "all-gather steps")),
    "overwrites": (_overwrites, ("expected", "not a sum", "+=")),
    "chunk": (_chunk, ("IndexError", "tensor_split(p) always returns p")),
    "not_in_place": (_not_in_place, ("expected", "unchanged", "in place")),
    "stub": (_stub, "not implemented"),
}, passes="[ok] ring_all_reduce: 7 cases passed (world sizes 2, 3, 4)"))
def test_checker_accepts_the_ring_and_names_each_mistake(answer, verdict):
    assert_check(lu.check_ring_all_reduce, answer, verdict)


def _calls(p, n, sends):
    """Per rank: (op, peer, bytes) for ``sends`` = {rank: [(dst, bytes)]}, each received."""
    calls = [[] for _ in range(p)]
    for src, messages in sends.items():
        for dst, nbytes in messages:
            calls[src].append(("send", dst, nbytes))
            calls[dst].append(("recv_", src, nbytes))
    return calls


def test_messages_of_a_ring_a_root_and_a_collective_are_told_apart():
    p, n = 4, 96                                   # 4 ranks, 24 float32
    ring = _calls(p, n, {r: [((r + 1) % p, n // p)] * 2 * (p - 1) for r in range(p)})
    assert exercises._not_a_ring(ring, p, n) is None
    root = _calls(p, n, {0: [(r, n) for r in range(1, p)],
                         **{r: [(0, n)] for r in range(1, p)}})
    assert "to or from rank 0" in exercises._not_a_ring(root, p, n)
    one_extra = _calls(p, n, {r: [((r + 1) % p, n // p)] * (2 * (p - 1) + (r == 2))
                              for r in range(p)})
    assert "rank 2 sends 168 bytes and receives 144" in exercises._not_a_ring(one_extra, p, n)
    assert "dist.all_reduce" in exercises._not_a_ring([[("allreduce_", None, n)]] * p, p, n)


def test_the_traced_case_divides_evenly_and_is_large():
    p, n = exercises.TRACED["world_size"], exercises.TRACED["n"]
    assert n % p == 0 and n >= 1 << 20


def test_a_ring_either_way_passes_and_partners_or_short_cycles_do_not():
    p, n = 4, 96
    left = _calls(p, n, {r: [((r - 1) % p, n // p)] * 2 * (p - 1) for r in range(p)})
    assert exercises._not_a_ring(left, p, n) is None
    # halving-doubling's pattern: the ring's bytes, but to partners at distance 2 and then 1
    partners = _calls(p, n, {r: [(r ^ 2, n // 2), (r ^ 1, n // 4), (r ^ 1, n // 4),
                                 (r ^ 2, n // 2)] for r in range(p)})
    assert "rank 0 sends to ranks [1, 2]" in exercises._not_a_ring(partners, p, n)
    pairs = _calls(p, n, {r: [(r ^ 1, n // p)] * 2 * (p - 1) for r in range(p)})
    assert "cycles of 2 ranks" in exercises._not_a_ring(pairs, p, n)
