"""Checkpoints that survive a crash and resume bit for bit (04b; the torchrun fault-tolerance run).

``save(ckpt_dir, step, model, optimizer, sampler)`` is collective (every rank calls it):

* model and optimiser go through ``torch.distributed.checkpoint`` (DCP: each rank writes its own
  shard in parallel; a replicated DDP model is written once), resolved with ``get_state_dict`` so
  the DDP wrapper's ``module.`` prefix never reaches the file;
* each rank writes its own ``rank_<r>.pt``: step, sampler position, and its RNG states (torch,
  Python, NumPy: every rank draws different random numbers, e.g. for augmentation);
* everything goes into ``step_<k>.tmp/``; when every rank has written and fsynced, rank 0 writes a
  manifest (size and SHA-256 of every file) and renames the directory to ``step_<k>`` -- one
  atomic ``rename``, so a crash at any point leaves either the whole checkpoint or a ``.tmp``
  directory that ``latest()`` ignores.

``load(path, model, optimizer, sampler)`` verifies the manifest first (a truncated or altered
file, or another world size, is a ``CheckpointError`` that says what to do), then restores
everything and returns the step to continue from. Per-rank files load with
``torch.load(weights_only=True)``: a checkpoint from elsewhere cannot run code.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.utils.data import DistributedSampler

from labutils.core.i18n import tr

MANIFEST = "MANIFEST.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used as it is; the message says why and what to do."""


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` that remembers how far into the epoch it got.

    ``state_dict()`` is ``{"epoch", "offset"}`` (indices already handed out this epoch); after
    ``load_state_dict`` the next iteration continues from there. ``set_epoch`` starts over.
    """

    def __init__(self, dataset, **kwargs):
        super().__init__(dataset, **kwargs)
        self.offset = 0

    def __iter__(self):
        indices = list(super().__iter__())  # the epoch's shuffled shard, as DistributedSampler
        while self.offset < len(indices):
            self.offset += 1
            yield indices[self.offset - 1]

    def set_epoch(self, epoch):
        super().set_epoch(epoch)
        self.offset = 0

    def state_dict(self):
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state):
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])


# ---- files: atomic writes and verification ----------------------------------------------

def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_save(obj, path):
    """``torch.save`` to a temporary file, fsync, then rename: the file is whole or absent."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_tree(path):
    for name in os.listdir(path):
        with open(os.path.join(path, name), "rb") as f:
            os.fsync(f.fileno())
    _fsync_dir(path)


def latest(ckpt_dir):
    """The newest complete checkpoint directory in ``ckpt_dir`` (None when there is none)."""
    if not os.path.isdir(ckpt_dir):
        return None
    steps = [(int(m.group(1)), name) for name in os.listdir(ckpt_dir)
             if (m := _STEP_DIR.match(name))]
    return os.path.join(ckpt_dir, max(steps)[1]) if steps else None


def verify(path, world_size=None):
    """Raise ``CheckpointError`` unless every file matches the manifest; return the manifest."""
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise CheckpointError(tr("{path} has no {manifest}: it is not a complete checkpoint "
                                 "(a save interrupted before it finished?); delete it and "
                                 "resume from an earlier one", path=path, manifest=MANIFEST))
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
        files = manifest["files"].items()
    except (ValueError, KeyError, AttributeError, TypeError) as e:   # JSON and UTF-8 errors
        raise CheckpointError(tr("{manifest} is damaged ({error}): delete {path} and resume "
                                 "from an earlier checkpoint", manifest=manifest_path,
                                 error=type(e).__name__, path=path)) from None
    for name, (size, digest) in files:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise CheckpointError(tr("checkpoint {path} is damaged: {name} is missing; delete "
                                     "the directory and resume from an earlier checkpoint",
                                     path=path, name=name))
        found = os.path.getsize(file)
        if found != size:
            raise CheckpointError(tr("checkpoint {path} is damaged: {name} has {found} bytes, "
                                     "the manifest says {size} (truncated?); delete the "
                                     "directory and resume from an earlier checkpoint",
                                     path=path, name=name, found=found, size=size))
        if _sha256(file) != digest:
            raise CheckpointError(tr("checkpoint {path} is damaged: {name} does not match its "
                                     "SHA-256 in the manifest; delete the directory and "
                                     "resume from an earlier checkpoint", path=path, name=name))
    if world_size is not None and manifest["world_size"] != world_size:
        raise CheckpointError(tr("checkpoint {path} was saved by {saved} ranks, this job has "
                                 "{world_size}: per-rank RNG states and sampler positions "
                                 "cannot be mapped; resume with world_size={saved} for a "
                                 "bit-exact resume", path=path, saved=manifest["world_size"],
                                 world_size=world_size))
    return manifest


# ---- save and load (collective) ----------------------------------------------------------

def rng_state():
    """This process's random states, as tensors and lists (loadable with weights_only=True)."""
    version, keys, gauss = random.getstate()
    _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "python": [version, list(keys), gauss],
            "numpy": [torch.from_numpy(np_keys.astype(np.int64)), np_pos, np_has_gauss,
                      np_gauss]}


def set_rng_state(state):
    torch.set_rng_state(state["torch"])
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, gauss))


def save(ckpt_dir, step, model, optimizer, sampler=None, extra=None):
    """Write checkpoint ``step_<step>`` (every rank calls this); returns its path."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    final = os.path.join(ckpt_dir, f"step_{step:06d}")
    tmp = final + ".tmp"
    if rank == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # what an earlier crash left behind
        os.makedirs(tmp)
    dist.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp)
    atomic_save({"step": step, "world_size": world_size, "rng": rng_state(),
                 "sampler": sampler.state_dict() if sampler is not None else None,
                 "extra": extra or {}}, os.path.join(tmp, f"rank_{rank}.pt"))
    dist.barrier()  # every rank's files are on disk
    if rank == 0:
        _fsync_tree(tmp)
        files = {n: (os.path.getsize(os.path.join(tmp, n)), _sha256(os.path.join(tmp, n)))
                 for n in sorted(os.listdir(tmp))}
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump({"step": step, "world_size": world_size, "files": files}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)  # the commit point: atomic on POSIX file systems
        _fsync_dir(ckpt_dir)
    dist.barrier()
    return final


def load(path, model, optimizer, sampler=None):
    """Restore model, optimiser, sampler and this rank's RNG states; return the rank's state."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    verify(path, world_size)
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    try:
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    except (Exception, CheckpointException) as e:  # DCP's messages name tensors, not the fix
        causes = [line for line in str(e).splitlines() if re.match(r"\w+(Error|Exception): ", line)]
        reason = (causes[-1] if causes else f"{type(e).__name__}: {str(e).strip()}")[:300]
        raise CheckpointError(tr("checkpoint {path} does not fit this model or optimiser "
                                 "({reason}); build the same model and optimiser that saved it",
                                 path=path, reason=reason)) from None
    mine = torch.load(os.path.join(path, f"rank_{rank}.pt"), weights_only=True)
    set_rng_state(mine["rng"])
    if sampler is not None and mine["sampler"] is not None:
        sampler.load_state_dict(mine["sampler"])
    return mine
