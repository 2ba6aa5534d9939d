"""Data x tensor x pipeline (x context) parallelism on one mesh, from the course's own pieces
(06e_composed_parallelism).

A small GPT (token and position embedding, transformer layers, a head) is an ``nn.Sequential``.
``ParallelDims`` places each rank at (pp, dp, cp, tp); the rank then

* keeps pipeline stage ``pp_rank`` of the layers (``model_parallel.split_model``),
* replaces each transformer layer of that stage with its Megatron version over its ``tp`` group
  (``tensor_parallel.ParallelTransformerLayer``: 2 all-reduces forward, 2 backward per layer),
* takes the ``dp_rank``-th slice of the batch and, with ``cp > 1``, the ``cp_rank``-th part of
  every sequence, whose attention runs over the ring of its ``cp`` group
  (``ring_attention``, 06d2: the keys and values travel, the tokens stay),
* runs the 1F1B schedule over its stage with send/recv to the same (dp, cp, tp) place in the
  neighbouring stages (``pipeline.run_schedule``),
* averages every gradient over its ``dp`` group (``ddp.naive_allreduce_grads``), then steps.
  With ``cp > 1`` over the dp x cp group instead (torchtitan's ``dp_shard_cp``): each rank's
  loss is the mean over its own tokens, every rank holds as many, so the mean of those
  gradients is the whole batch's.

Embedding and head are replicated inside a tensor-parallel group: their inputs are identical on
every rank of it, so their gradients are too, and need no communication. Nothing here observes
itself: counting and timing attach in ``experiments.composed_runs``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from labutils.core.i18n import tr
from labutils.parallel.ddp import naive_allreduce_grads
from labutils.parallel.model_parallel import split_model
from labutils.parallel.pipeline import run_schedule, stage_schedules
from labutils.parallel.ring_attention import RingLayout, ring_attention
from labutils.parallel.tensor_parallel import (
    ParallelTransformerLayer,
    TPLayout,
    TransformerLayer,
    validate_tp_config,
)


class Embedding(nn.Module):
    """(B, T) token ids -> (B, T, H): token plus position embedding."""

    def __init__(self, vocab_size, seq_len, hidden):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, hidden)
        self.pos = nn.Embedding(seq_len, hidden)
        self.positions = None    # context parallelism: the global positions this rank holds

    def forward(self, idx):                                     # (B, T)
        positions = torch.arange(idx.shape[1]) if self.positions is None else self.positions
        return self.tok(idx) + self.pos(positions)              # (B, T, H)


class RingAttend:
    """A self-attention layer's ``attend`` for a rank holding only part of each sequence: ring
    attention over the ``cp`` group (06d2) instead of attention over the local tokens."""

    def __init__(self, ring, cp_rank, cp_group):
        self.ring, self.cp_rank, self.cp_group = ring, cp_rank, cp_group

    def __call__(self, qkv, num_heads):                 # (B, T/cp, 3H/tp): this rank's heads
        B, T, _ = qkv.shape
        q, k, v = (t.view(B, T, num_heads, -1).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        y = ring_attention(q, k, v, self.ring, self.cp_rank, self.cp_group)  # (B, h, T, hd)
        return y.transpose(1, 2).reshape(B, T, -1)


GPT_DEFAULTS = {"vocab_size": 32, "seq_len": 8, "hidden": 16, "num_heads": 4, "n_layers": 2}


def gpt_config(model_kwargs=None):
    """The small GPT's sizes: the defaults, updated by ``model_kwargs``."""
    return {**GPT_DEFAULTS, **(model_kwargs or {})}


def make_gpt(vocab_size=32, seq_len=8, hidden=16, num_heads=4, n_layers=2, seed=0):
    """The small GPT as layers a pipeline can cut: embedding, ``n_layers`` transformer layers,
    head. Same seed, same weights in every process, in the default dtype (the lab: float64)."""
    torch.manual_seed(seed)
    return nn.Sequential(Embedding(vocab_size, seq_len, hidden),
                         *[TransformerLayer(hidden, num_heads) for _ in range(n_layers)],
                         nn.Linear(hidden, vocab_size))


def gpt_loss(logits, targets):
    """Next-token cross-entropy, mean over every position of the (micro-)batch."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def validate_composed(dims, world_size, batch, n_microbatches, hidden=16, num_heads=4,
                      n_layers=2, seq_len=8):
    """Refuse, before any process starts, a layout that does not fit the world or the model."""
    dims.validate(world_size)
    if seq_len % dims.cp:
        raise ValueError(tr("a sequence of {seq} tokens cannot be split into cp={cp} equal "
                            "parts: use a cp that divides {seq}, or a seq_len divisible by "
                            "{cp}.", seq=seq_len, cp=dims.cp))
    validate_tp_config(hidden, num_heads, dims.tp)
    split_model(nn.Sequential(*[nn.Identity()] * (n_layers + 2)), dims.pp)  # too many stages?
    if batch % (dims.dp * n_microbatches):
        raise ValueError(tr("a batch of {batch} samples cannot be split into dp={dp} slices of "
                            "{m} equal micro-batches: use a batch divisible by {need}.",
                            batch=batch, dp=dims.dp, m=n_microbatches,
                            need=dims.dp * n_microbatches))


def build_stage(model, me, tp_group, cp_group=None):
    """This rank's stage of ``model``: its pipeline slice, transformer layers tensor-parallel;
    with cp > 1, its positions and attention those of its part of the sequence."""
    ring = RingLayout(model[0].pos.num_embeddings, me.dims.cp)   # which tokens are mine
    stage = split_model(model, me.dims.pp)[me.pp_rank]
    layout = TPLayout(me.tp_rank, me.dims.tp, group=tp_group)
    for name, layer in stage.named_children():
        if isinstance(layer, TransformerLayer):
            layer = ParallelTransformerLayer(layer, layout)
            if me.dims.cp > 1:
                layer.attn.attend = RingAttend(ring, me.cp_rank, cp_group)
            setattr(stage, name, layer)
        elif isinstance(layer, Embedding) and me.dims.cp > 1:
            layer.positions = ring.positions(me.cp_rank)
    return stage


def composed_step(stage, me, grad_group, ops, prev_ops, x_mbs, y_mbs, in_shape):
    """One training step's forward and backward on this rank; returns the loss (last stage).
    ``grad_group``: the dp group, or with cp > 1 the dp x cp group."""
    loss = run_schedule(ops, stage, me, x_mbs, y_mbs, in_shape, prev_ops, loss_fn=gpt_loss)
    if me.dims.dp * me.dims.cp > 1:                  # one slice of data: nothing to average
        naive_allreduce_grads(stage, group=grad_group)   # the mean over the group
    return loss


def grad_group(mesh, dims):
    """The group a gradient is averaged over: dp, or with cp > 1 the dp and cp dimensions
    flattened into one (``DeviceMesh._flatten``, as torchtitan's ``dp_shard_cp``)."""
    if dims.cp == 1:
        return mesh.get_group("dp")
    return mesh["dp", "cp"]._flatten("dp_cp").get_group()


def composed_worker(rank, world_size, dims, x, y, model_kwargs=None, n_microbatches=2,
                    steps=2, lr=0.1, schedule="1f1b", step_fn=composed_step):
    """Train ``steps`` SGD steps of the small GPT on the (pp, dp, cp, tp) mesh of ``dims``.

    Returns ``coords``, ``losses`` (last stage; the mean over this rank's tokens), ``grads``
    after the first step and ``params`` after the last (by the whole model's names).
    ``step_fn``: a function with ``composed_step``'s signature (an observer wraps it).
    In float64: the sums run in another order than in one process, and float64 keeps that
    difference near 1e-15, far below what a wrong split would change (the lab asserts 1e-9).
    """
    torch.set_default_dtype(torch.float64)   # this rank's own process: nothing else to restore
    dims.validate(world_size)
    mesh = dims.build_mesh()
    me = dims.coords(rank)
    stage = build_stage(make_gpt(**(model_kwargs or {})), me, mesh.get_group("tp"),
                        mesh.get_group("cp"))
    group = grad_group(mesh, dims)
    optimizer = torch.optim.SGD(stage.parameters(), lr=lr)
    ops, prev_ops = stage_schedules(schedule, me.pp_rank, dims.pp, n_microbatches)
    x, y = x.chunk(dims.dp)[me.dp_rank], y.chunk(dims.dp)[me.dp_rank]   # my data slice
    mine = RingLayout(x.shape[1], dims.cp).positions(me.cp_rank)        # my tokens of it
    x, y = x[:, mine], y[:, mine]
    x_mbs, y_mbs = x.chunk(n_microbatches), y.chunk(n_microbatches)
    in_shape = (*x_mbs[0].shape, gpt_config(model_kwargs)["hidden"])   # (B/dp/m, T/cp, H)
    losses, grads = [], None
    for _ in range(steps):
        losses.append(step_fn(stage, me, group, ops, prev_ops, x_mbs, y_mbs, in_shape))
        if grads is None:
            grads = {n: p.grad.clone() for n, p in stage.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
    return {"coords": me.as_dict(), "losses": losses if me.pp_is_last_stage else [],
            "grads": grads, "params": {n: p.detach().clone() for n, p in stage.named_parameters()}}


def reference_train(x, y, model_kwargs=None, steps=2, lr=0.1):
    """One process, the whole model on the whole batch, float64: what every layout must
    reproduce."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = make_gpt(**(model_kwargs or {}))
    finally:
        torch.set_default_dtype(previous)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses, grads = [], None
    for _ in range(steps):
        loss = gpt_loss(model(x), y)
        loss.backward()
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "grads": grads,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}
