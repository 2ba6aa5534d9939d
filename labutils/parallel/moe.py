"""Expert parallelism for a mixture-of-experts layer (lab 06d3), as in GShard (arXiv:2006.16668),
Switch Transformer (arXiv:2101.03961) and DeepSpeed-MoE: ``E`` experts over ``N`` ranks, ``E/N``
each; every rank routes its own tokens, sends each kept slot to the rank that owns its expert with
one ``all_to_all_single`` (uneven splits), runs its experts, and sends the results back with the
reverse all-to-all. ``MoE`` is the single-process reference (all tokens, one process); it routes
each source rank's shard with the same ``moe_router.route``, so both make the same decisions;
``route`` itself is checked against an independent plain-Python router in tests/test_moe.py.

Per layer and step, every rank issues 5 ``all_to_all_single``: forward, the per-expert counts
(``E`` integers), dispatch and combine; backward, the reverse of dispatch and of combine. The
receiver splits what it got by the per-expert counts alone, so the dispatch order (by rank, then
by expert, then slot order) is this layer's contract, not a convention.

Autograd through the all-to-all: ``AllToAll`` below, whose backward is the reverse all-to-all.
PyTorch has the same as ``torch.distributed._functional_collectives.all_to_all_single_autograd``
(a private module); it works on gloo in torch 2.13, and tests/test_moe.py checks ours against it.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from labutils.core.i18n import tr
from labutils.parallel.moe_router import dispatch_indices, route


def validate_expert_parallel(num_experts, world_size):
    """Refuse a split of ``num_experts`` that does not give every rank the same experts."""
    if world_size < 1 or num_experts % world_size:
        fits = [n for n in range(1, num_experts + 1) if num_experts % n == 0]
        raise ValueError(tr("{num_experts} experts cannot be split evenly over {world_size} ranks "
                            "(expert parallelism gives each rank E/N experts). Use a world size "
                            "in {fits}, or a number of experts divisible by {world_size}.",
                            num_experts=num_experts, world_size=world_size, fits=fits))


class Expert(nn.Module):
    """One expert: a small MLP ``h -> ffn -> h``."""

    def __init__(self, hidden, ffn):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class MoE(nn.Module):
    """The single-process reference: router and all ``E`` experts. ``forward`` takes the list of
    the source ranks' token shards, routes each shard alone (capacity is per source rank) and
    returns each shard's output ``x + sum_j gate_j * expert_j(x)``, and the mean aux loss."""

    def __init__(self, hidden, num_experts, top_k=2, capacity_factor=1.25, ffn=None):
        super().__init__()
        self.top_k, self.capacity_factor = top_k, capacity_factor
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden, ffn or 2 * hidden)
                                     for _ in range(num_experts))

    @property
    def num_experts(self):
        return len(self.experts)

    def route(self, x):
        return route(x, self.router.weight, self.top_k, self.capacity_factor)

    def forward(self, shards):
        routings = [self.route(x) for x in shards]
        outputs = [x.clone() for x in shards]                       # the residual
        for e, expert in enumerate(self.experts):
            # every kept slot of expert e, shard by shard in slot order: one batch, one call
            picks = [(s, (r.keep & (r.expert == e)).flatten().nonzero()[:, 0])
                     for s, r in enumerate(routings)]
            rows = torch.cat([shards[s][slots // self.top_k] for s, slots in picks])
            out, start = expert(rows), 0
            for s, slots in picks:
                gate = routings[s].gate.flatten()[slots, None]
                part = out[start:start + len(slots)]
                outputs[s] = outputs[s].index_add(0, slots // self.top_k, gate * part)
                start += len(slots)
        aux = torch.stack([r.aux_loss for r in routings]).mean()
        return outputs, aux, routings


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits; backward sends the gradients back the way the
    rows came (the reverse all-to-all: the split sizes swapped)."""

    @staticmethod
    def forward(ctx, x, send_counts, recv_counts):
        ctx.splits = (send_counts, recv_counts)
        return all_to_all(x, send_counts, recv_counts)

    @staticmethod
    def backward(ctx, grad):
        send_counts, recv_counts = ctx.splits
        return all_to_all(grad, recv_counts, send_counts), None, None


def all_to_all(x, send_counts, recv_counts):
    """Rows ``x`` grouped by destination rank, ``send_counts[r]`` of them for rank ``r``; returns
    the ``sum(recv_counts)`` rows received, grouped by source rank."""
    out = x.new_empty((sum(recv_counts), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv_counts, send_counts)
    return out


def exchange_counts(per_expert, world_size):
    """Tell every rank how many rows it will receive from each source rank for each of its
    experts: one all-to-all of ``E`` integers (rank ``r`` gets the ``E/N`` counts of its experts
    from every rank). Returns ``[N, E/N]``: row ``s`` = source rank ``s``'s counts."""
    recv = torch.empty_like(per_expert)
    dist.all_to_all_single(recv, per_expert)
    return recv.view(world_size, -1)


def run_local_experts(experts, rows, counts):
    """Each local expert on its rows, one batch per expert. ``rows`` are as received: grouped by
    source rank, and within each source's block by local expert (the dispatch order sorts by
    expert: this function RELIES on it, it has no expert ids); ``counts[s, e]`` rows of source
    ``s`` for local expert ``e``. Returns the outputs in the received order."""
    num_sources, num_local = counts.shape
    chunks = torch.split(rows, counts.flatten().tolist())          # (source, expert) order
    outs = [expert(torch.cat([chunks[s * num_local + e] for s in range(num_sources)]))
            for e, expert in enumerate(experts)]
    back = [torch.split(out, counts[:, e].tolist()) for e, out in enumerate(outs)]
    return torch.cat([back[e][s] for s in range(num_sources) for e in range(num_local)])


class ExpertParallelMoE(nn.Module):
    """This rank's part of ``MoE``: a copy of the router (replicated: all-reduce its gradient as
    data parallelism does) and experts ``rank * E/N .. (rank+1) * E/N - 1``."""

    def __init__(self, reference, rank, world_size):
        super().__init__()
        validate_expert_parallel(reference.num_experts, world_size)
        self.rank, self.world_size = rank, world_size
        self.top_k, self.capacity_factor = reference.top_k, reference.capacity_factor
        self.num_experts = reference.num_experts
        local = self.num_experts // world_size
        self.first = rank * local
        self.router = copy.deepcopy(reference.router)
        self.experts = nn.ModuleList(copy.deepcopy(reference.experts[e])
                                     for e in range(self.first, self.first + local))

    def forward(self, x):                                             # x: [T, h], own tokens
        """This rank's tokens through the layer: ``(output [T, h], aux loss, Routing)``."""
        r = route(x, self.router.weight, self.top_k, self.capacity_factor)
        kept = r.keep.flatten().nonzero()[:, 0]                       # kept slots
        experts = r.expert.flatten()[kept]
        order, send_counts = dispatch_indices(experts, self.num_experts, self.world_size)
        slots = kept[order]                                           # by rank, then expert
        recv_counts = exchange_counts(                                # [N, E/N]
            torch.bincount(experts, minlength=self.num_experts), self.world_size)
        send, recv = send_counts.tolist(), recv_counts.sum(1).tolist()
        rows = AllToAll.apply(x[slots // self.top_k], send, recv)     # dispatch
        out = run_local_experts(self.experts, rows, recv_counts)
        back = AllToAll.apply(out, recv, send)                        # combine, as `slots`
        gate = r.gate.flatten()[slots, None]
        return x.index_add(0, slots // self.top_k, gate * back), r.aux_loss, r
