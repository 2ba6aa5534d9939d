"""labutils.parallel.checkpoint: atomic, verified checkpoints; resume after a kill is bit-exact."""
import os

import pytest
import torch

import labutils as lu
from labutils import checkpoint

STEPS = 12


def _train(rank, world_size, **kwargs):
    return lu.resumable_training.train_script(rank, world_size, steps=STEPS, batch_size=32, **kwargs)


@pytest.mark.lab04b
@pytest.mark.slow
def test_resume_after_kill_is_bit_exact(tmp_path):
    full = lu.launch(_train, world_size=2)[0]
    ckpt = str(tmp_path / "ckpt")
    with pytest.raises(lu.WorkerError, match="rank 1: process killed by signal SIGKILL"):
        lu.launch(_train, ckpt_dir=ckpt, ckpt_every=4, kill_at_step=7, world_size=2)
    assert os.path.basename(checkpoint.latest(ckpt)) == "step_000004"
    resumed = lu.launch(_train, ckpt_dir=ckpt, ckpt_every=4, world_size=2)[0]
    assert resumed["start"] == 4
    # steps 5..12 replayed from the checkpoint: the very same losses and weights, bit for bit
    assert list(resumed["losses"]) == list(range(5, STEPS + 1))
    for step, loss in resumed["losses"].items():
        assert loss == full["losses"][step], step
    for name, value in full["state"].items():
        assert torch.equal(resumed["state"][name], value), name
    assert not any(n.endswith(".tmp") for n in os.listdir(ckpt))


def _save_tiny(rank, world_size, ckpt_dir, hidden=8):
    from torch import nn
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, hidden))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return checkpoint.save(ckpt_dir, 3, model, opt)


def _load_tiny(rank, world_size, path, hidden=8):
    from torch import nn
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, hidden))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return checkpoint.load(path, model, opt)["step"]


@pytest.mark.lab04b
@pytest.mark.slow
def test_damaged_or_mismatched_checkpoint_refused(tmp_path):
    path = lu.launch(_save_tiny, str(tmp_path), world_size=2)[0]
    assert lu.launch(_load_tiny, path, world_size=2) == [3, 3]
    checkpoint.verify(path, world_size=2)  # intact: no error
    with pytest.raises(checkpoint.CheckpointError, match="saved by 2 ranks.*world_size=2"):
        checkpoint.verify(path, world_size=3)   # checked in the caller, before ranks start
    with pytest.raises(lu.WorkerError, match="does not fit this model"):
        lu.launch(_load_tiny, path, hidden=5, world_size=2)
    victim = os.path.join(path, "rank_1.pt")
    with open(victim, "r+b") as f:  # a save cut short by a full disk
        f.truncate(os.path.getsize(victim) // 2)
    with pytest.raises(checkpoint.CheckpointError, match="rank_1.pt has .* bytes.*truncated"):
        checkpoint.verify(path)
    with pytest.raises(lu.WorkerError, match="CheckpointError: .*truncated"):
        lu.launch(_load_tiny, path, world_size=2)


@pytest.mark.lab04b
def test_incomplete_checkpoint_is_ignored_and_refused(tmp_path):
    os.makedirs(tmp_path / "step_000008.tmp")   # a crash in the middle of a save
    (tmp_path / "step_000008.tmp" / "rank_0.pt").write_bytes(b"partial")
    assert checkpoint.latest(str(tmp_path)) is None
    os.makedirs(tmp_path / "step_000009")       # a directory without its manifest
    with pytest.raises(checkpoint.CheckpointError, match="no MANIFEST.json"):
        checkpoint.verify(str(tmp_path / "step_000009"))


@pytest.mark.lab04b
def test_atomic_save_and_weights_only_load(tmp_path):
    path = str(tmp_path / "x.pt")
    checkpoint.atomic_save({"rng": checkpoint.rng_state(), "step": 3}, path)
    assert os.listdir(tmp_path) == ["x.pt"]  # no temporary file left
    state = torch.load(path, weights_only=True)
    before = torch.rand(3)
    checkpoint.set_rng_state(state["rng"])
    assert torch.equal(torch.rand(3), before)  # the same random numbers again


@pytest.mark.lab04b
def test_resumable_sampler_continues_mid_epoch():
    data = list(range(20))
    a = checkpoint.ResumableSampler(data, num_replicas=2, rank=1, seed=3)
    a.set_epoch(2)
    it = iter(a)
    head = [next(it) for _ in range(4)]
    b = checkpoint.ResumableSampler(data, num_replicas=2, rank=1, seed=3)
    b.load_state_dict(a.state_dict())
    assert head + list(b) == list(checkpoint.ResumableSampler.__bases__[0].__iter__(a))
