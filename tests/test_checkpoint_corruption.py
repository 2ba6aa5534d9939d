"""lu.checkpoint: a file altered in place, its size unchanged (bit rot, a bad sector, a stray
write), is refused by verify() and load() with a CheckpointError naming the file; the
untouched checkpoint still verifies and loads. Only the SHA-256 in the manifest can catch
this: the size check that catches a truncated file does not.

save() is collective (it needs a process group), so checkpoints are written by one real rank;
verify() and latest() are plain file operations, checked in the test process itself."""
import json
import os
import shutil

import pytest
import torch

import labutils as lu

EARLY, LATE = 3, 7  # the two checkpoints saved


def _model_and_opt():
    from torch import nn
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 8))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _save_two(rank, world_size, ckpt_dir):
    model, opt = _model_and_opt()
    paths = []
    for step in (EARLY, LATE):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        paths.append(lu.checkpoint.save(ckpt_dir, step, model, opt))
    return paths


def _try_load(rank, world_size, paths):
    """Load each path into a fresh model: ("ok", step), or the error's type name and message."""
    outcomes = []
    for path in paths:
        model, opt = _model_and_opt()
        try:
            outcomes.append(("ok", lu.checkpoint.load(path, model, opt)["step"]))
        except Exception as e:  # noqa: BLE001 - the type is what the test asserts
            outcomes.append((type(e).__name__, str(e)))
    return outcomes


def _flip_in_place(path, n=4):
    """Invert ``n`` bytes in the middle of ``path`` without changing its length."""
    size = os.path.getsize(path)
    assert size >= n, path
    at = size // 2 - n // 2
    with open(path, "r+b") as f:
        f.seek(at)
        chunk = f.read(n)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in chunk))  # every bit of the n bytes changes
    assert os.path.getsize(path) == size


def _manifest_files(path):
    with open(os.path.join(path, lu.checkpoint.MANIFEST)) as f:
        return sorted(json.load(f)["files"])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint directory holding step EARLY and step LATE, written by one rank."""
    ckpt_dir = str(tmp_path_factory.mktemp("ckpt"))
    early, late = lu.launch(_save_two, ckpt_dir, world_size=1, timeout=90)[0]
    return ckpt_dir, early, late


@pytest.fixture
def damaged_copies(saved, tmp_path):
    """For every file under LATE's manifest, a copy of LATE with that one file flipped."""
    _, _, late = saved
    copies = {}
    for name in _manifest_files(late):
        copy = str(tmp_path / f"damaged{name}" / os.path.basename(late))
        shutil.copytree(late, copy)
        _flip_in_place(os.path.join(copy, name))
        copies[name] = copy
    return copies


@pytest.mark.lab04b
@pytest.mark.slow
def test_verify_refuses_every_file_altered_in_place(saved, damaged_copies):
    _, early, late = saved
    for path, step in ((early, EARLY), (late, LATE)):  # untouched: no error
        assert lu.checkpoint.verify(path, world_size=1)["step"] == step
    # per-rank state, DCP's shard and DCP's metadata: all under the manifest, all checked
    assert "rank_0.pt" in damaged_copies and ".metadata" in damaged_copies
    assert any(name.endswith(".distcp") for name in damaged_copies), sorted(damaged_copies)
    for name, path in damaged_copies.items():
        assert os.path.getsize(os.path.join(path, name)) == os.path.getsize(
            os.path.join(late, name))  # the size check alone would pass it
        with pytest.raises(lu.checkpoint.CheckpointError) as err:
            lu.checkpoint.verify(path)
        msg = str(err.value)
        assert name in msg and "SHA-256" in msg, msg   # names the file and the check
        assert "truncated" not in msg, msg             # not mistaken for a short file
        assert "resume from an earlier checkpoint" in msg, msg  # says what to do
    lu.checkpoint.verify(late, world_size=1)  # damaging the copies left the original intact


@pytest.mark.lab04b
@pytest.mark.slow
def test_load_refuses_damaged_and_resume_falls_back_after_deleting(saved, damaged_copies,
                                                                  tmp_path):
    ckpt_dir, early, late = saved
    # A resume directory whose newest checkpoint rotted in place. latest() picks by name
    # among complete (renamed) checkpoints, it does not read them: load() is what refuses,
    # and its message says to delete the directory and resume from an earlier one.
    resume_dir = str(tmp_path / "resume")
    shutil.copytree(ckpt_dir, resume_dir)
    newest = lu.checkpoint.latest(resume_dir)
    assert os.path.basename(newest) == os.path.basename(late)
    _flip_in_place(os.path.join(newest, "rank_0.pt"))
    with pytest.raises(lu.checkpoint.CheckpointError, match="delete the directory"):
        lu.checkpoint.verify(newest)
    shutil.rmtree(newest)                       # what the message says to do
    fallback = lu.checkpoint.latest(resume_dir)
    assert os.path.basename(fallback) == os.path.basename(early)

    # in one rank: every damaged copy refused before the model is touched, then the
    # untouched checkpoints (same rank, same process) and the fall-back still load
    names = list(damaged_copies)
    outcomes = lu.launch(_try_load, [damaged_copies[n] for n in names] + [late, fallback],
                         world_size=1, timeout=90)[0]
    for name, (kind, detail) in zip(names, outcomes):
        assert kind == "CheckpointError", (name, kind, detail)
        assert name in detail and "SHA-256" in detail, detail
    assert outcomes[len(names):] == [("ok", LATE), ("ok", EARLY)]


@pytest.mark.lab04b
@pytest.mark.slow
@pytest.mark.parametrize("damage", ["non-utf8 byte", "json syntax"])
def test_damaged_manifest_is_a_checkpoint_error(saved, tmp_path, damage):
    _, _, late = saved
    copy = str(tmp_path / os.path.basename(late))
    shutil.copytree(late, copy)
    manifest = os.path.join(copy, lu.checkpoint.MANIFEST)
    size = os.path.getsize(manifest)
    if damage == "non-utf8 byte":
        _flip_in_place(manifest, n=1)
    else:  # the opening brace becomes a bracket: still ASCII, same size, no longer JSON
        with open(manifest, "r+b") as f:
            assert f.read(1) == b"{"
            f.seek(0)
            f.write(b"[")
    assert os.path.getsize(manifest) == size
    with pytest.raises(lu.checkpoint.CheckpointError, match="MANIFEST"):
        lu.checkpoint.verify(copy)
