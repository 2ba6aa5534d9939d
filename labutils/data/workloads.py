"""Three training workloads sized for a laptop: ``get("digits")``, ``get("text")``, ``get("video")``.

A ``Workload`` bundles data, a model factory, a loss and a quality measure, so a training loop
(``labutils.data.train``) or a parallel lab needs only the name::

    wl = lu.workloads.get("digits")
    model = wl.make_model(seed=0)                  # same seed -> same initial weights
    X, y = wl.train_set
    loss = wl.loss_fn(model(X[:64]), y[:64])       # mean loss over the batch
    wl.metric(model)                                # test accuracy (or perplexity)

=========  ============================  ===================  ==========================
name       data                          model                metric (test set)
=========  ============================  ===================  ==========================
digits     8x8 digit scans, 10 classes   ``DigitsCNN``        accuracy (higher is better)
text       characters of data/corpus.txt ``CharGPT``          perplexity (lower is better)
video      moving-digit clips, 4 motions ``ClipCNN3d``        accuracy (higher is better)
=========  ============================  ===================  ==========================

Inside ranks pass the *name* and call ``get(name)`` there (it is cached per process), rather
than sending a Workload, which carries its data, to every rank. Used by 02_pytorch_essentials,
03c_scenarios and the DDP and parallelism labs.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from labutils.data import datasets as data
from labutils.data import models

NAMES = ("digits", "text", "video")


@dataclass(frozen=True)
class Workload:
    """Data, model factory, loss and metric of one task (see the module docstring)."""
    name: str
    build_model: Callable[[], nn.Module]     # unseeded constructor; use make_model(seed)
    train_set: tuple                          # (X, y) tensors, indexed together
    test_set: tuple
    loss_fn: Callable                         # (model output, targets) -> mean loss (scalar)
    metric_name: str                          # "accuracy" or "perplexity"
    batch_size: int                           # default global batch size
    lr: float                                 # default learning rate
    optimizer: str = "sgd"                    # "sgd" (momentum 0.9) or "adamw"

    @property
    def higher_is_better(self):
        return self.metric_name == "accuracy"

    def make_model(self, seed=0):
        """A freshly initialised model; the same seed gives the same weights on every rank."""
        with torch.random.fork_rng(devices=[]):  # leave the caller's random state alone
            torch.manual_seed(seed)
            return self.build_model()

    def make_optimizer(self, params, lr=None):
        """The workload's optimiser over ``params`` (``lr`` defaults to ``self.lr``)."""
        lr = self.lr if lr is None else lr
        if self.optimizer == "adamw":
            return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        return torch.optim.SGD(params, lr=lr, momentum=0.9)

    @torch.no_grad()
    def metric(self, model, dataset=None, batch_size=256):
        """Accuracy or perplexity of ``model`` on ``dataset`` (default: the test set)."""
        X, y = self.test_set if dataset is None else dataset
        was_training = model.training
        model.eval()
        total, hits, loss_sum = 0, 0, 0.0
        for i in range(0, len(X), batch_size):
            out = model(X[i:i + batch_size])
            target = y[i:i + batch_size]
            n = len(target)
            if self.metric_name == "accuracy":
                hits += int((out.argmax(-1) == target).sum())
            else:
                loss_sum += float(self.loss_fn(out, target)) * n
            total += n
        model.train(was_training)
        if self.metric_name == "accuracy":
            return hits / total
        return math.exp(loss_sum / total)


def _lm_loss(logits, targets):
    """Mean next-character cross-entropy over every position: (B, T, V), (B, T) -> scalar."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@functools.lru_cache(maxsize=None)
def get(name):
    """The workload called ``name`` (one of ``NAMES``), built once per process."""
    if name == "digits":
        return Workload("digits", models.DigitsCNN, data.digits("train"), data.digits("test"),
                        F.cross_entropy, "accuracy", batch_size=64, lr=0.05)
    if name == "text":
        vocab, block = data.tokenizer().vocab_size, 32
        return Workload("text", lambda: models.CharGPT(vocab, block_size=block),
                        data.text_windows(data.text("train"), block),
                        data.text_windows(data.text("test"), block),
                        _lm_loss, "perplexity", batch_size=16, lr=0.3)
    if name == "video":
        return Workload("video", models.ClipCNN3d, data.moving_digits("train"),
                        data.moving_digits("test"), F.cross_entropy, "accuracy",
                        batch_size=32, lr=0.05)
    raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(NAMES)}")
