"""labutils.parallel.collectives: ring, recursive-doubling and halving-doubling all-reduce equal
dist.all_reduce; labutils.parallel.collective_demo: every collective, before and after; their
runs, counts and times in labutils.experiments.collective_runs. The ring exercise's checker is
tested in test_lab03a1_exercise."""
import pytest
import torch

import labutils as lu
from labutils.core.commcount import Call
from labutils import collective_demo as D
from labutils import collective_runs as R
from labutils import collectives as C

pytestmark = pytest.mark.lab03a1

LENGTHS = (1, 3, 5, 7, 33)  # shorter than, equal to, not divisible by the world size
DTYPES = (torch.float32, torch.int64, torch.bfloat16)


def _assert_same_sum(got, expected, x, world_size, what):
    """``got`` and ``expected`` both sum the ranks' ``x`` in some order. Any order of a sum of
    W terms errs by at most gamma_(W-1) * sum|x_r| per element (Higham, Accuracy and Stability,
    4.2; gamma_k = k*u / (1 - k*u), u = half the dtype's epsilon): two orders differ by at most
    twice that. Elementwise adds round alike on every CPU, so this bound is all the slack there
    is; integers (and W = 1) must match exactly."""
    import torch.distributed as dist
    if not got.is_floating_point():
        assert torch.equal(got, expected), what
        return
    abs_sum = x.abs().double()
    dist.all_reduce(abs_sum)                 # sum over ranks of |x_r|, in float64
    ku = (world_size - 1) * torch.finfo(x.dtype).eps / 2
    bound = 2 * ku / (1 - ku) * abs_sum
    err = (got.double() - expected.double()).abs()
    assert (err <= bound).all(), f"{what}: off by {err.max():.3g}, bound {bound.max():.3g}"


def _compare_with_gloo(rank, world_size):
    import torch.distributed as dist
    for n in LENGTHS:
        for dtype in DTYPES:
            g = torch.Generator().manual_seed(1000 * rank + n)
            x = (torch.randn(n, generator=g) * 10).to(dtype)
            expected = x.clone()
            dist.all_reduce(expected)
            for name in ("ring", "recursive_doubling", "root", "halving_doubling"):
                got = x.clone()
                out = C.ALL_REDUCES[name](got)
                assert out is got  # in place, like dist.all_reduce
                _assert_same_sum(got, expected, x, world_size, f"{name} n={n} {dtype}")
    # a non-contiguous tensor (a transposed matrix) is reduced in place too
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(rank)).t()
    expected = x.clone()
    dist.all_reduce(expected)
    for fn in (C.ring_all_reduce, C.recursive_doubling_all_reduce, C.root_all_reduce,
               C.halving_doubling_all_reduce):
        got = x.clone().t().contiguous().t()  # same layout as x
        fn(got)
        _assert_same_sum(got, expected, x, world_size, f"{fn.__name__}, non-contiguous")
    # every rank holds bit-identical results (replicas must not drift apart)
    for fn in (C.ring_all_reduce, C.halving_doubling_all_reduce):
        y = torch.randn(37, generator=torch.Generator().manual_seed(rank))
        fn(y)
        ys = [torch.empty_like(y) for _ in range(world_size)]
        dist.all_gather(ys, y)
        assert all(torch.equal(ys[0], other) for other in ys), fn.__name__
    return True


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_all_reduces_equal_dist_all_reduce(world_size):
    assert lu.launch(_compare_with_gloo, world_size=world_size, timeout=120) == [True] * world_size


def _in_subgroup(rank, world_size):
    import torch.distributed as dist
    group = dist.new_group([1, 2, 3])
    x = torch.full((5,), float(rank))
    if rank == 0:
        return x.tolist()
    C.ring_all_reduce(x, group=group)
    y = torch.full((5,), float(rank))
    C.recursive_doubling_all_reduce(y, group=group)
    z = torch.full((5,), float(rank))
    C.halving_doubling_all_reduce(z, group=group)
    return x.tolist() + y.tolist() + z.tolist()


@pytest.mark.slow
def test_all_reduces_respect_the_group():
    out = lu.launch(_in_subgroup, world_size=4)
    assert out[0] == [0.0] * 5
    assert all(r == [6.0] * 15 for r in out[1:])  # 1 + 2 + 3, rank 0 left out


@pytest.mark.slow
def test_every_collective_before_after():
    res = R.run_collectives(world_size=4)
    assert set(res) == set(D.COLLECTIVES)
    assert res["all_reduce"][1] == [[60.0, 64.0, 68.0]] * 4
    assert res["broadcast"][1] == [[0.0, 1.0, 2.0]] * 4
    assert res["reduce"][1][0] == [60.0, 64.0, 68.0]
    assert res["all_gather"][1] == [[0.0, 10.0, 20.0, 30.0]] * 4
    assert res["reduce_scatter"][1] == [[60.0], [64.0], [68.0], [72.0]]
    assert res["scatter"][1] == [[0.0], [1.0], [2.0], [3.0]]
    assert res["gather"][1][0] == [0.0, 10.0, 20.0, 30.0]
    assert res["send_recv"][1][1] == [0.0, 1.0, 2.0]  # rank 1 got rank 0's tensor
    fig = lu.figures.plot_collectives(res)
    assert len(fig.axes) == 2 * len(D.COLLECTIVES)


def test_bad_input_refused_before_launch():
    with pytest.raises(ValueError, match="unknown collective"):
        R.run_collectives(names=["allreduce"])
    with pytest.raises(ValueError, match="world_size >= 2"):
        R.measure_all_reduce([1024], world_size=1)
    with pytest.raises(ValueError, match="unknown all-reduce"):
        R.measure_all_reduce([1024], impls=["tree2"])


def test_bandwidth_definitions():
    # nccl-tests: algbw = bytes / time; busbw = algbw * 2 (p - 1) / p for all-reduce
    assert lu.costmodel.algorithm_bandwidth(1e9, 2.0) == 5e8
    assert lu.costmodel.bus_bandwidth(1e9, 2.0, 4) == pytest.approx(5e8 * 1.5)
    assert lu.costmodel.bus_bandwidth(1e9, 2.0, 2) == pytest.approx(5e8)


@pytest.mark.slow
def test_measure_all_reduce_returns_stats_per_size():
    stats = R.measure_all_reduce([4 * 1024, 64 * 1024], world_size=2, repeats=2)
    assert set(stats) == {"gloo", "ring", "recursive_doubling"}
    assert all(len(v) == 2 and all(s.n == 2 and s.min > 0 for s in v) for v in stats.values())
    # one round times every size and every variant: all of them are paired round by round
    assert lu.timing.compare(stats["ring"][0], stats["gloo"][0]).paired
    assert lu.timing.compare(stats["ring"][0], stats["ring"][1]).paired


@pytest.mark.slow
def test_measure_all_reduce_on_an_emulated_link():
    link = lu.costmodel.Link("emulated", 1e9, 1e-3)
    stats = R.measure_all_reduce([1024, 4096], world_size=2, link=link, repeats=2,
                                 impls=("ring", "halving_doubling"))
    assert set(stats) == {"ring", "halving_doubling"}
    assert all(len(v) == 2 and all(s.n == 2 for s in v) for v in stats.values())
    with pytest.raises(ValueError, match="emulate the from-scratch"):
        R.measure_all_reduce([1024], link=link)   # gloo would only wait out the model


@pytest.mark.slow
def test_measure_all_reduce_budget_adds_rounds_on_every_rank_alike():
    stats = R.measure_all_reduce([1024], world_size=2, impls=("ring",), repeats=2, budget_s=0.5)
    assert 2 <= stats["ring"][0].n <= 40


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_traced_messages_and_bytes_per_rank(world_size):
    p, numel = world_size, 12 * 5 * 7        # divisible by 2, 3 and 4: no uneven chunks
    n = numel * 4                            # bytes of the fp32 tensor
    t = R.trace_all_reduce(p, numel, names=("ring", "recursive_doubling", "root",
                                            "halving_doubling"))
    ring, rd, root, hd = (t[k] for k in ("ring", "recursive_doubling", "root", "halving_doubling"))
    # the ring: 2(p-1) message steps on every rank, each rank sends and receives 2(p-1)/p n
    assert ring["steps"] == [2 * (p - 1)] * p
    assert ring["sent"] == ring["received"] == [2 * (p - 1) * n // p] * p
    assert ring["link"] == {(r, (r + 1) % p): 2 * (p - 1) * n // p for r in range(p)}
    assert set(ring["link"]) == {(r, (r + 1) % p) for r in range(p)}   # neighbours only
    # recursive doubling: log2 p rounds of whole tensors; 3 steps at p = 3 (fold, 1 round, unfold)
    assert max(rd["steps"]) == {2: 1, 3: 3, 4: 2}[p]
    # halving-doubling: 2 log2 p steps carrying the ring's bytes (p = 3 folds: +2 steps)
    assert max(hd["steps"]) == {2: 2, 3: 4, 4: 4}[p]
    if p in (2, 4):
        assert hd["sent"] == hd["received"] == [2 * (p - 1) * n // p] * p
    # via a root: rank 0 receives and sends (p-1) whole tensors; every other rank one each way
    assert root["received"][0] == root["sent"][0] == (p - 1) * n
    assert root["sent"][1:] == root["received"][1:] == [n] * (p - 1)
    # every algorithm moves at least 2(p-1) n in total; the ring's busiest rank is at the bound
    for name, tr in t.items():
        assert sum(tr["sent"]) == sum(tr["link"].values()) >= 2 * (p - 1) * n, name
        assert max(tr["sent"]) >= 2 * (p - 1) * n // p, name
        assert sum(tr["sent"]) == sum(tr["received"]), name   # every byte sent was received


def test_message_steps_pair_a_receive_with_the_send_posted_before_it():
    calls = lambda ops: [Call(op, 4, 2, 1, 0.0) for op in ops]
    assert R.message_steps(calls(["send", "recv_"] * 3)) == 3          # ring exchanges
    assert R.message_steps(calls(["recv_", "recv_", "send", "send"])) == 4   # a root, in turn
    assert R.message_steps(calls(["recv_", "send", "recv_", "send"])) == 3   # fold, swap, unfold
    assert R.message_steps(calls(["allreduce_", "send"])) == 1          # collectives: not messages


def test_trace_refuses_gloo():
    with pytest.raises(ValueError, match="from-scratch"):
        R.trace_all_reduce(2, 8, names=("gloo",))


@pytest.mark.slow
def test_measure_all_reduce_with_calls_per_sample():
    stats = R.measure_all_reduce([1024], world_size=2, impls=("ring", "root"), repeats=3, calls=4)
    assert set(stats) == {"ring", "root"}
    assert all(s[0].n == 3 and s[0].min > 0 for s in stats.values())


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_trace_against_gloo_bit_for_bit(world_size):
    names = ("ring", "recursive_doubling", "halving_doubling")
    t = R.trace_all_reduce(world_size, 37, names=names, against_gloo=True)
    assert {name: t[name]["agrees"] for name in names} == dict.fromkeys(names, True)
    assert "agrees" not in R.trace_all_reduce(world_size, 8, names=("ring",))["ring"]


def _reduce_scatter_only(tensor):
    """Typical mistake (test_i18n checks its message in Chinese): stops after the reduce-scatter
    phase (no all-gather)."""
    import torch.distributed as dist
    world_size, rank = dist.get_world_size(), dist.get_rank()
    chunks = list(tensor.view(-1).tensor_split(world_size))
    for step in range(world_size - 1):
        send = chunks[(rank - step) % world_size]
        recv = chunks[(rank - step - 1) % world_size]
        buf = torch.empty_like(recv)
        C._exchange(send, (rank + 1) % world_size, buf, (rank - 1) % world_size)
        recv += buf
    return tensor


def test_round_order_rotates_so_every_impl_leads_once_per_cycle():
    impls = ("ring", "recursive_doubling", "halving_doubling")
    orders = [R.round_order(impls, i) for i in range(4)]
    assert orders[0] == list(impls) and orders[3] == orders[0]
    assert [o[0] for o in orders[:3]] == list(impls)           # each leads once
    assert all(sorted(o) == sorted(impls) for o in orders)       # each runs every round
    assert R.round_order(["gloo"], 5) == ["gloo"]
