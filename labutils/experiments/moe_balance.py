"""Router collapse without the load-balancing loss (lab 06d3): a short, seeded training run of the
single-process ``MoE`` (top-1, no token dropped) with and without Switch's auxiliary loss, and the
share of the tokens its busiest expert gets at every step. Also the token-major against the
priority capacity order, counted on the lab's routing.

Shazeer et al. (2017) observed that a router trained without a push sends most tokens to a few
experts: an expert chosen more trains more, becomes more useful, and is chosen more. The run here
makes that visible on a toy regression: inputs share a common direction (as activations after a
LayerNorm often do), so raising one expert's router weight along it raises that expert's
probability for every token. Routing is the same function on one process as on ranks (the
router is replicated under expert parallelism), so one process suffices."""
from __future__ import annotations

import torch
from torch import nn

from labutils.parallel.moe import MoE
from labutils.parallel.moe_router import keep_within_capacity, route


def _task(seed, tokens, hidden, offset, scale):
    """Inputs with a shared direction and a teacher MLP's targets (residual form, as the layer)."""
    g = torch.Generator().manual_seed(1000 + seed)
    teacher = nn.Sequential(nn.Linear(hidden, 64), nn.Tanh(), nn.Linear(64, hidden))
    direction = torch.randn(hidden, generator=g)
    x = torch.randn(tokens, hidden, generator=g) + offset * direction / direction.norm()
    with torch.no_grad():
        y = x + scale * teacher(x)
    return x, y


def train_router(aux_weight, seed=0, steps=150, num_experts=4, hidden=16, tokens=128, lr=3e-2,
                 offset=3.0, scale=3.0):
    """Full-batch Adam on the mean squared error plus ``aux_weight`` times the aux loss. Returns
    ``{"top_share": [busiest expert's share of the tokens, per step], "aux_loss": [...],
    "task_loss": [...]}``; capacity ``T`` (factor ``E``), so no token is dropped and the load is
    the router's choice alone."""
    torch.manual_seed(seed)
    layer = MoE(hidden, num_experts, top_k=1, capacity_factor=float(num_experts), ffn=8)
    x, target = _task(seed, tokens, hidden, offset, scale)
    opt = torch.optim.Adam(layer.parameters(), lr=lr)
    history = {"top_share": [], "aux_loss": [], "task_loss": []}
    for _ in range(steps):
        (y,), aux, (routing,) = layer([x])
        task = ((y - target) ** 2).mean()
        opt.zero_grad()
        (task + aux_weight * aux).backward()
        opt.step()
        load = routing.slots_per_expert(num_experts)
        history["top_share"].append(int(load.max()) / tokens)
        history["aux_loss"].append(float(aux.detach()))
        history["task_loss"].append(float(task.detach()))
    return history


def collapse_runs(aux_weights=(0.0, 0.1), seeds=(0, 1, 2), **config):
    """``train_router`` for every weight and seed: ``{(weight, seed): history}``; one thread, so
    the run is the same however many cores the machine has."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {(w, s): train_router(w, s, **config) for w in aux_weights for s in seeds}
    finally:
        torch.set_num_threads(threads)


def capacity_orders(ref, shards):
    """Route each source rank's shard (``ref``: an ``MoE``) and count, over all shards, the slots
    dropped in priority order (first choices first) and in token-major order, in total and
    among first choices: ``{"priority": (dropped, first choices dropped), "token-major": ...,
    "slots": n, "first choices kept only by priority": n}``."""
    counts = {"priority": [0, 0], "token-major": [0, 0], "slots": 0,
              "first choices kept only by priority": 0}
    with torch.no_grad():
        for x in shards:
            r = route(x, ref.router.weight, ref.top_k, ref.capacity_factor)
            token_major = keep_within_capacity(r.expert, ref.num_experts, r.capacity,
                                               first_choices_first=False)
            for name, keep in (("priority", r.keep), ("token-major", token_major)):
                counts[name][0] += int((~keep).sum())
                counts[name][1] += int((~keep[:, 0]).sum())
            counts["slots"] += r.expert.numel()
            counts["first choices kept only by priority"] += int(
                (r.keep[:, 0] & ~token_major[:, 0]).sum())
    return {k: tuple(v) if isinstance(v, list) else v for k, v in counts.items()}
