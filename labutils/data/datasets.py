"""The course's three data sets, all on disk or generated; nothing is downloaded.

* images: scikit-learn's bundled digits (1,797 real 8x8 scans), ``digits(split)``;
* text: a character-level corpus stored in ``data/corpus.txt``, ``text(split)``, ``CharTokenizer``;
* video: moving-digit clips generated deterministically from the digits, ``moving_digits(split)``.

Every function returns plain tensors ``(X, y)`` (or token ids) and is cached, so calling it in
every rank is cheap. Used by ``labutils.data.workloads`` and the notebooks 02_pytorch_essentials,
03c_scenarios and the DDP / parallelism labs through ``labutils.data.workloads``.
"""
from __future__ import annotations

import functools
import pathlib

import numpy as np
import torch

from labutils.core.env import ROOT

DATA_DIR = pathlib.Path(ROOT) / "data"
SPLITS = ("train", "test")

# One fixed split for the whole course: every lab, rank and run sees the same test digits.
DIGITS_SEED = 0
DIGITS_TEST_SIZE = 360          # 20 % of 1,797


def _check_split(split, allowed=SPLITS):
    if split not in allowed:
        raise ValueError(f"split must be one of {', '.join(map(repr, allowed))}; got {split!r}")


# ---- images --------------------------------------------------------------------------------

DIGITS_SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"


def digits_path():
    """Path of ``data/digits/digits.csv.gz``: the UCI digits test set (1,797 8x8 images, CC BY
    4.0), the copy scikit-learn ships; source and licence in data/digits/README.md."""
    path = DATA_DIR / "digits" / "digits.csv.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; it is part of the repository: restore it "
                                f"with `git checkout -- data/digits/digits.csv.gz`")
    return path


@functools.lru_cache(maxsize=None)
def _digits_all():
    # Reading 1,797 lines costs milliseconds in every rank.
    table = torch.from_numpy(np.loadtxt(digits_path(), delimiter=","))      # (1797, 65)
    images = table[:, :64].to(torch.float32).view(-1, 8, 8)                 # 0..16
    X = images.unsqueeze(1)                                                 # (1797, 1, 8, 8)
    y = table[:, 64].to(torch.int64)
    # torch's own generator, not sklearn's shuffling: the split must not change with versions.
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(DIGITS_SEED))
    test_idx, train_idx = order[:DIGITS_TEST_SIZE], order[DIGITS_TEST_SIZE:]
    # Normalise with the *training* mean and std only (no peeking at the test set).
    mean, std = X[train_idx].mean(), X[train_idx].std()
    X = (X - mean) / std
    return {"train": (X[train_idx], y[train_idx]), "test": (X[test_idx], y[test_idx]),
            "raw": images, "train_idx": train_idx, "test_idx": test_idx}


def digits(split="train"):
    """``(X, y)``: X float32 (N, 1, 8, 8) normalised with the training mean/std, y int64 in 0..9.

    The train/test split is fixed (seed 0): 1,437 training and 360 test images.
    """
    _check_split(split)
    X, y = _digits_all()[split]
    return X.clone(), y.clone()


def digits_raw(split="train"):
    """``(images, y)``: the same split, pixel values 0..1 (for pictures and the video clips)."""
    _check_split(split)
    d = _digits_all()
    idx = d[f"{split}_idx"]
    images = d["raw"][idx] / 16.0  # (N, 8, 8)
    return images, _digits_all()[split][1].clone()


# ---- text ----------------------------------------------------------------------------------

CORPUS_PATH = DATA_DIR / "corpus.txt"
TEXT_VAL_FRACTION = 0.1


@functools.lru_cache(maxsize=None)
def corpus():
    """The text corpus as one string (CPython's Language Reference chapters, see data/README.md)."""
    if not CORPUS_PATH.exists():
        raise FileNotFoundError(f"{CORPUS_PATH} is missing; it is part of the repository "
                                f"(rebuild it with: .venv/bin/python data/make_corpus.py)")
    return CORPUS_PATH.read_text(encoding="utf-8")


class CharTokenizer:
    """Character-level tokeniser: one id per distinct character of ``text``, in sorted order."""

    def __init__(self, text):
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, s):
        """String -> int64 tensor of ids; a character outside the vocabulary is an error."""
        try:
            return torch.tensor([self.stoi[c] for c in s], dtype=torch.int64)
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the corpus vocabulary "
                             f"({self.vocab_size} characters)") from None

    def decode(self, ids):
        """Ids (tensor or list) -> string."""
        return "".join(self.chars[int(i)] for i in ids)


@functools.lru_cache(maxsize=None)
def tokenizer():
    """The course's tokeniser, built from the whole corpus."""
    return CharTokenizer(corpus())


@functools.lru_cache(maxsize=None)
def _corpus_ids():
    return tokenizer().encode(corpus())


def text(split="train"):
    """Token ids (int64, 1-D) of the corpus: the first 90 % is ``train``, the last 10 % ``test``."""
    _check_split(split)
    ids = _corpus_ids()
    cut = int(len(ids) * (1 - TEXT_VAL_FRACTION))
    return ids[:cut].clone() if split == "train" else ids[cut:].clone()


def text_windows(ids, block_size=32):
    """``(X, Y)`` of shape (N, block_size): non-overlapping windows, Y is X shifted by one."""
    if block_size < 1 or len(ids) < block_size + 1:
        raise ValueError(f"block_size must be in 1..{len(ids) - 1}; got {block_size}")
    n = (len(ids) - 1) // block_size
    X = ids[: n * block_size].view(n, block_size)
    Y = ids[1: n * block_size + 1].view(n, block_size)
    return X.clone(), Y.clone()


# ---- video ---------------------------------------------------------------------------------

# Direction of motion (the label): unit steps (dy, dx) in pixels per frame.
DIRECTIONS = ("right", "left", "down", "up")
_STEPS = {"right": (0, 1), "left": (0, -1), "down": (1, 0), "up": (-1, 0)}
VIDEO_SEEDS = {"train": 1, "test": 2}


def make_clips(images, n, frames=8, size=16, seed=0):
    """Generate ``n`` clips from 8x8 ``images`` (M, 8, 8): ``(clips, direction, which)``.

    clips: float32 (n, 1, frames, size, size); clip i shows ``images[which[i]]`` moving one
    pixel per frame in ``DIRECTIONS[direction[i]]``, starting at a random position from which
    it stays inside the frame. Deterministic given ``seed``.
    """
    travel = frames - 1
    if size < 8 + travel:
        raise ValueError(f"a digit moving {travel} pixels needs size >= {8 + travel}; got "
                         f"size={size} with frames={frames}")
    g = torch.Generator().manual_seed(seed)
    which = torch.randint(len(images), (n,), generator=g)
    direction = torch.randint(len(DIRECTIONS), (n,), generator=g)
    free = size - 8                                          # room for the top-left corner
    start = torch.randint(free + 1, (n, 2), generator=g)     # (row, col) of the first frame
    clips = torch.zeros(n, 1, frames, size, size)

    def first(u, step):  # along the direction of motion, start where the whole path fits
        return u if step == 0 else (0 if step > 0 else travel) + u % (free - travel + 1)

    for i in range(n):
        dy, dx = _STEPS[DIRECTIONS[direction[i]]]
        r0, c0 = first(int(start[i, 0]), dy), first(int(start[i, 1]), dx)
        for t in range(frames):
            r, c = r0 + dy * t, c0 + dx * t
            clips[i, 0, t, r:r + 8, c:c + 8] = images[which[i]]
    return clips, direction, which


@functools.lru_cache(maxsize=None)
def _clips(split, n, frames, size):
    images, digit = digits_raw(split)
    clips, direction, which = make_clips(images, n, frames, size, seed=VIDEO_SEEDS[split])
    return clips, direction, digit[which]


def moving_digits(split="train", n=None, frames=8, size=16):
    """``(clips, direction)``: clips float32 (n, 1, frames, size, size), direction int64 in 0..3.

    Training clips move training digits, test clips move test digits (no leakage). Defaults:
    1,024 training and 256 test clips of 8 frames of 16x16. The digit shown in each clip is
    ``moving_digits_digit_labels(split, ...)``.
    """
    _check_split(split)
    n = n or (1024 if split == "train" else 256)
    clips, direction, _ = _clips(split, n, frames, size)
    return clips.clone(), direction.clone()


def moving_digits_digit_labels(split="train", n=None, frames=8, size=16):
    """The digit (0..9) shown in each clip of ``moving_digits`` with the same arguments."""
    _check_split(split)
    n = n or (1024 if split == "train" else 256)
    return _clips(split, n, frames, size)[2].clone()
