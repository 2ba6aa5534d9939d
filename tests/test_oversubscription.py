"""labutils.experiments.oversubscription: per-rank times measured inside the ranks, launch
time apart."""
import pytest

from labutils.experiments import oversubscription as O

pytestmark = pytest.mark.lab03e2


@pytest.mark.slow
def test_per_rank_times_and_launch_time_are_apart():
    res = O.measure_oversubscription(world_sizes=(1, 2), rounds=2, steps=5, warmup=2)
    assert set(res) == {1, 2}
    for p, r in res.items():
        assert r["timed_steps"] == [3]                   # steps - warmup, on every rank
        assert r["compute"].n == r["step"].n == r["launch"].n == 2
        # compute is part of each step, and each step part of the launch
        assert r["compute"].median <= r["step"].median
        assert r["step"].max < r["launch"].min
    with pytest.raises(ValueError, match="warmup"):
        O.measure_oversubscription(steps=3, warmup=3)


def test_worker_times_compute_inside_the_step(monkeypatch):
    # one rank alone: all_reduce on a world of one is replaced by a no-op
    import torch.distributed as dist
    monkeypatch.setattr(dist, "all_reduce", lambda t: None)
    out = O.fixed_work_worker(0, 1, steps=4, warmup=1, n=8)
    assert len(out["compute"]) == len(out["step"]) == 3
    assert all(c <= s for c, s in zip(out["compute"], out["step"]))
