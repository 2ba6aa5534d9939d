"""lab 03b's controls (labutils.experiments.staleness): the traces that turn a replay into serial
SGD, the staleness counted from a trace, and the straggler experiment's invariants."""
import pytest
import torch

from labutils import async_sgd as A
from labutils import staleness as St

from .test_async_sgd import _digits   # the flattened digits, loaded once

pytestmark = pytest.mark.lab03b

CFG = A.SGDConfig(steps=30, batch_size=16, lr=0.1, eval_every=10)


def test_round_robin_is_every_workers_step_in_turn_at_staleness_zero():
    assert St.round_robin(2, 2, first_rank=1) == [(1, 0, 0), (2, 0, 1), (1, 1, 2), (2, 1, 3)]


def test_round_robin_of_one_worker_replayed_is_plain_sgd():
    X, y = _digits()
    replayed = St.replay_parameter_server(X, y, CFG, St.round_robin(1, CFG.steps))
    torch.testing.assert_close(replayed, A.reference_sgd(X, y, CFG, 1))


@pytest.mark.parametrize("staleness", [0, 3])
def test_fixed_staleness_replayed_is_the_simulation(staleness):
    X, y = _digits()
    trace = St.with_fixed_staleness(St.round_robin(1, CFG.steps), staleness)
    assert [k - v for k, (_, _, v) in enumerate(trace)][staleness:] == \
        [staleness] * (CFG.steps - staleness)
    torch.testing.assert_close(St.replay_parameter_server(X, y, CFG, trace),
                               St.delayed_sgd(X, y, CFG, staleness)["params"])


def test_shuffled_order_is_round_robins_batches_reordered_at_staleness_zero():
    rr = St.round_robin(3, 5, first_rank=1)
    orders = [St.shuffled_order(3, 5, seed, first_rank=1) for seed in range(4)]
    assert St.shuffled_order(3, 5, 0, first_rank=1) == orders[0]         # seeded: it repeats
    assert len({tuple(o) for o in orders}) > 1                            # the seed moves it
    for o in orders:
        assert sorted((w, s) for w, s, _ in o) == sorted((w, s) for w, s, _ in rr)
        assert [v for _, _, v in o] == list(range(len(rr)))               # staleness 0
        for w in (1, 2, 3):                                               # a worker's own order
            assert [s for r, s, _ in o if r == w] == list(range(5))


def test_staleness_is_counted_per_worker_from_the_trace():
    run = {"trace": [(1, 0, 0), (2, 0, 0), (1, 1, 1), (1, 2, 3), (2, 1, 2)]}
    assert St.staleness_of(run, 1) == [0, 1, 0]
    assert St.staleness_of(run, 2) == [1, 2]


@pytest.mark.slow
def test_straggler_runs_keep_their_invariants():
    X, y = _digits()
    cfg = A.with_(CFG, steps=12, eval_every=6, delay=0.005)
    res = St.straggler_runs(X, y, cfg, workers=2, repeats=2, orders=3)
    assert len(res["serial_orders_loss"]) == 3
    assert set(res["runs"]) == {(m, d) for m in ("sync", "parameter server", "Hogwild")
                                for d in ("straggler", "no straggler")}
    work = 2 * cfg.steps * cfg.batch_size
    assert all(r["examples"][-1] == work for rs in res["runs"].values() for r in rs)
    # sync's arithmetic has a fixed order: the straggler changes its time, not one bit of it
    syncs = res["runs"][("sync", "straggler")] + res["runs"][("sync", "no straggler")]
    assert all(torch.equal(r["params"], syncs[0]["params"]) for r in syncs)
    torch.testing.assert_close(syncs[0]["params"], res["serial_large"])
    # the server's control: its own trace at staleness 0, one process
    for d in ("straggler", "no straggler"):
        for r in res["runs"][("parameter server", d)]:
            replay = St.replay_parameter_server(X, y, cfg, St.with_fixed_staleness(r["trace"], 0))
            assert r["serial_loss"] == A.full_loss(replay, X, y, cfg.hidden)
            assert len(St.staleness_of(r, 1)) + len(St.staleness_of(r, 2)) == 2 * cfg.steps
    assert res["serial_small_loss"] < res["runs"][("sync", "straggler")][0]["loss"][0]
