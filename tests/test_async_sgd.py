"""labutils.parallel.async_sgd: sync SGD equals single-process SGD; the async ones converge."""
import functools

import pytest
import torch

import labutils as lu
from labutils import async_sgd as A

pytestmark = pytest.mark.lab03a

CFG = A.SGDConfig(steps=60, batch_size=16, lr=0.1, eval_every=20)


@functools.lru_cache(maxsize=None)
def _digits():
    X, y = lu.datasets.digits("train")
    return X.flatten(1), y


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_sync_sgd_equals_single_process_sgd_on_the_union_of_batches(world_size):
    X, y = _digits()
    run = A.run_sync(X, y, CFG, world_size=world_size)
    torch.testing.assert_close(run["params"], A.reference_sgd(X, y, CFG, world_size))
    assert run["examples"] == [0, 20 * world_size * 16, 40 * world_size * 16, 60 * world_size * 16]


@pytest.mark.slow
def test_parameter_server_with_one_worker_is_plain_sgd():
    X, y = _digits()
    run = A.run_parameter_server(X, y, CFG, world_size=2)  # server + worker rank 1
    assert run["staleness"] == [0] * CFG.steps             # nobody else updates in between
    torch.testing.assert_close(run["params"], A.reference_sgd(X, y, CFG, 1, first_rank=1))


@pytest.mark.slow
def test_parameter_server_with_a_straggler_converges():
    X, y = _digits()
    cfg = A.with_(CFG, delay=0.01)
    run = A.run_parameter_server(X, y, cfg, world_size=3)
    # robust facts only: the interleaving is up to the OS scheduler
    assert sum(run["pushes"]) == len(run["staleness"]) == cfg.steps * 2
    assert min(run["staleness"]) >= 0
    assert run["loss"][-1] < 0.5 * run["loss"][0]


@pytest.mark.slow
def test_hogwild_one_rank_is_plain_sgd_and_two_ranks_converge():
    X, y = _digits()
    one = A.run_hogwild(X, y, CFG, world_size=1)
    torch.testing.assert_close(one["params"], A.reference_sgd(X, y, CFG, 1))
    two = A.run_hogwild(X, y, CFG, world_size=2)
    assert two["loss"][-1] < 0.5 * two["loss"][0]
    assert two["examples"][-1] == CFG.steps * 2 * CFG.batch_size


def test_delayed_sgd_staleness_zero_is_sgd_and_large_staleness_hurts():
    X, y = _digits()
    cfg = A.with_(CFG, steps=100)
    fresh = lu.staleness.delayed_sgd(X, y, cfg, 0)
    torch.testing.assert_close(fresh["params"], A.reference_sgd(X, y, cfg, 1))
    stale = lu.staleness.delayed_sgd(X, y, cfg, 16)
    assert stale["loss"][-1] > fresh["loss"][-1]


def test_bad_settings_refused_before_launch():
    X, y = _digits()
    with pytest.raises(ValueError, match="steps"):
        A.run_sync(X, y, A.with_(CFG, steps=0))
    with pytest.raises(ValueError, match="world_size"):
        A.run_parameter_server(X, y, CFG, world_size=1)
    with pytest.raises(ValueError, match="flatten"):
        A.run_hogwild(X.view(-1, 1, 8, 8), y, CFG)
    with pytest.raises(ValueError, match="delay"):
        A.run_sync(X, y, A.with_(CFG, delay=-1.0))
