"""The model that lab 03b trains on real ranks: a small MLP on the digits whose parameters live
in ONE flat fp32 vector, so a rank can send, receive or share all of them as a single tensor;
and the seeded mini-batch each worker draws at each step, so a run can be replayed exactly.

Used by ``labutils.parallel.async_sgd`` (which re-exports these names) and
``labutils.experiments.staleness``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _shapes(n_in, hidden, n_out):
    return [(n_in, hidden), (hidden,), (hidden, n_out), (n_out,)]


def init_params(n_in, n_out, cfg):
    """The flat initial parameter vector (the same on every rank: seeded)."""
    g = torch.Generator().manual_seed(cfg.seed)
    parts = []
    for shape in _shapes(n_in, cfg.hidden, n_out):
        fan_in = shape[0] if len(shape) == 2 else cfg.hidden
        parts.append((torch.rand(shape, generator=g) * 2 - 1).flatten() / fan_in ** 0.5)
    return torch.cat(parts)


def _forward(params, X, hidden, n_out):
    W1, b1, W2, b2 = torch.split(params, [X.shape[1] * hidden, hidden, hidden * n_out, n_out])
    h = F.relu(X @ W1.view(X.shape[1], hidden) + b1)      # (B, hidden)
    return h @ W2.view(hidden, n_out) + b2                 # (B, n_out)


def loss_and_grad(params, X, y, hidden, n_out=10):
    """Mean cross-entropy of the batch and its gradient, on a snapshot of ``params``."""
    p = params.detach().clone().requires_grad_(True)  # a snapshot: others may write params now
    loss = F.cross_entropy(_forward(p, X, hidden, n_out), y)
    (grad,) = torch.autograd.grad(loss, p)
    return loss.item(), grad


def full_loss(params, X, y, hidden, n_out=10):
    with torch.no_grad():
        return F.cross_entropy(_forward(params, X, hidden, n_out), y).item()


def accuracy(params, X, y, hidden, n_out=10):
    """Share of ``X`` classified correctly by the MLP with parameters ``params``."""
    with torch.no_grad():
        return (_forward(params, X, hidden, n_out).argmax(1) == y).float().mean().item()


def batch_indices(cfg, worker, step, n):
    """The mini-batch worker ``worker`` draws at ``step``: fixed by the seed, so runs repeat."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + worker * 10_007 + step)
    return torch.randint(0, n, (cfg.batch_size,), generator=g)
