"""DeepSpeed-Ulysses (labutils.parallel.ulysses, lab 06d2): attention on sequence shards with
all-to-alls equal to one process (outputs and every gradient) at N = 2, 3, 4; the all-to-alls
counted (4 forward, 4 backward, bytes equal to the formula); the hand-written all-to-all equal
to PyTorch's differentiable one; a head count N does not divide refused before launch."""
import pytest
import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single_autograd

import labutils as lu
from labutils import ulysses
from labutils import ulysses_equivalence as ue

pytestmark = pytest.mark.lab06d2


def test_heads_not_divisible_is_refused_before_any_process_starts(monkeypatch):
    def no_launch(*a, **k):
        raise AssertionError("a process was started for a bad configuration")
    monkeypatch.setattr(lu.ulysses_equivalence, "launch", no_launch)
    with pytest.raises(ValueError, match=r"num_heads=6 is not divisible by world_size=4: use "
                                         r"a world size that divides 6 \(1, 2, 3, 6\) or "
                                         r"change num_heads"):
        ue.run_ulysses_check(4, num_heads=6, hidden=48)
    with pytest.raises(ValueError, match="seq_len=50 is not divisible by world_size=4"):
        ue.run_ulysses_check(4, seq=50)


def test_ring_moves_more_than_ulysses_beyond_two_ranks():
    rows = ue.traffic_rows((2, 3, 4, 6, 12))
    assert rows[0]["ulysses_formula"] == rows[0]["ring_formula"]       # N = 2: equal
    for r in rows[1:]:
        assert r["ulysses_formula"] < r["ring_formula"]
    assert [r["ulysses_formula"] for r in rows] == sorted((r["ulysses_formula"] for r in rows),
                                                          reverse=True)


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3, 4])
def test_ulysses_equals_one_process_and_counts_its_all_to_alls(n):
    res = ue.run_ulysses_check(n)   # asserts every output and gradient
    for phase in ("forward", "backward"):
        assert res["calls"][phase] == {"alltoall_base_": 4}   # q, k, v in; the output back
        assert res["bytes"][phase] == lu.long_context.ulysses_bytes(48, 2, 48, n, 8, phase)
        assert res["bytes"][phase] == 4 * (n - 1) * (48 // n) * 2 * 48 * 8 // n


def _both_all_to_alls(rank, world_size):
    torch.manual_seed(rank)
    x = torch.randn(2, 6, 12, 3, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 6 * world_size, 12 // world_size, 3, dtype=torch.float64)
    ours = ulysses.SeqToHeads.apply(x, world_size)
    (ours * dy).sum().backward()
    ours_grad, x.grad = x.grad, None
    # PyTorch's: the same block order (row j to rank j), then the same reshape
    send = x.reshape(2, 6, world_size, 12 // world_size, 3).permute(2, 0, 1, 3, 4).contiguous()
    recv = all_to_all_single_autograd(send.view(world_size, -1), None, None, dist.group.WORLD)
    theirs = recv.view(world_size, 2, 6, 12 // world_size, 3).permute(1, 0, 2, 3, 4).reshape(
        dy.shape)
    (theirs * dy).sum().backward()
    return ours.detach(), theirs.detach(), ours_grad, x.grad


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3])
def test_hand_written_all_to_all_equals_pytorchs_differentiable_one(n):
    for ours, theirs, ours_grad, their_grad in lu.launch(_both_all_to_alls, world_size=n,
                                                         warn_oversubscription=False):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        torch.testing.assert_close(ours_grad, their_grad, rtol=0, atol=0)
