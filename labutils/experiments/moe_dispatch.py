"""Expert parallelism run and counted (lab 06d3): a mixture-of-experts layer on real ranks against
its single-process reference (outputs, aux loss and every gradient), the all-to-all's bytes
counted at PyTorch's dispatcher (``core.commcount``), and dropped slots counted per capacity
factor.

The routing counts printed by the lab reproduce on other CPUs only because no top-k decision is
near a tie: ``assert_decision_gap`` asserts it for every seeded run here."""
from __future__ import annotations

import torch
import torch.distributed as dist

from labutils.core.commcount import count_collectives
from labutils.core.i18n import tr
from labutils.core.launcher import launch
from labutils.parallel.moe import ExpertParallelMoE, MoE, validate_expert_parallel
from labutils.parallel.moe_router import decision_gap

AUX_WEIGHT = 0.01   # Switch Transformer's alpha for the load-balancing loss
# torch.randn inputs made by another CPU kernel (ATEN_CPU_CAPABILITY=default vs avx2) differ by up
# to 1.7e-6, the router probabilities by up to 1.2e-7 (measured); a top-k decision whose
# probabilities are further apart than this limit (~40x that) falls the same way there
MIN_DECISION_GAP = 5e-6


def build(world_size, hidden=16, num_experts=4, top_k=2, capacity_factor=1.25, tokens=32,
          seed=0):
    """The seeded reference layer, each rank's tokens and upstream gradient (same on every rank)."""
    torch.manual_seed(seed)
    ref = MoE(hidden, num_experts, top_k, capacity_factor)
    shards = [torch.randn(tokens, hidden) for _ in range(world_size)]
    upstream = [torch.randn(tokens, hidden) for _ in range(world_size)]
    return ref, shards, upstream


def assert_decision_gap(ref, shards):
    """The smallest top-k decision margin over all shards; refuse a seed that lands near a tie
    (its counts could differ on another CPU)."""
    gap = min(decision_gap(x, ref.router.weight, ref.top_k) for x in shards)
    if gap <= MIN_DECISION_GAP:
        raise AssertionError(tr("a routing decision is within {gap:.1e} of a tie (limit {limit}): "
                                "its counts could differ on another CPU; use another seed",
                                gap=gap, limit=MIN_DECISION_GAP))
    return gap


def expert_parallel_step(rank, world_size, **config):
    """Worker: forward and backward of this rank's part of the layer on its own tokens; the
    replicated router's gradient all-reduced (summed) as data parallelism does."""
    ref, shards, upstream = build(world_size, **config)
    layer = ExpertParallelMoE(ref, rank, world_size)
    x = shards[rank].clone().requires_grad_()
    with count_collectives() as forward:
        y, aux, routing = layer(x)
    with count_collectives() as backward:
        # each rank's share of the global loss: its tokens, and 1/N of the mean aux loss
        ((y * upstream[rank]).sum() + AUX_WEIGHT * aux / world_size).backward()
    dist.all_reduce(layer.router.weight.grad)
    aux_mean = aux.detach().clone()
    dist.all_reduce(aux_mean)
    per_rank = layer.num_experts // world_size
    owner = routing.expert[routing.keep] // per_rank       # kept slots' destination ranks
    # the all-to-alls in the order the layer issues them: forward the counts, dispatch,
    # combine; backward the reverse of combine, then of dispatch
    calls = forward.of("alltoall") + backward.of("alltoall")
    phases = ("counts", "dispatch", "combine", "combine backward", "dispatch backward")
    handed = dict(zip(phases, (c.nbytes for c in calls)))
    # bytes to OTHER ranks, from the split sizes each call was handed at the dispatcher (its own
    # block stays in memory); nothing here reads the layer's routing
    off_rank = dict(zip(phases, (c.off_rank_bytes for c in calls)))
    # a token whose kept slots both go to the same remote rank is sent once per slot
    remote = routing.keep & (routing.expert // per_rank != rank)
    same_rank = (routing.expert[:, :1] // per_rank == routing.expert // per_rank).all(dim=1)
    return {"output": y.detach(), "aux_loss": aux_mean / world_size, "input_grad": x.grad,
            "router_grad": layer.router.weight.grad,
            "expert_grads": {f"{layer.first + i}.{n}": p.grad
                             for i, e in enumerate(layer.experts)
                             for n, p in e.named_parameters()},
            "handed": handed,
            "bytes": {ph: n for ph, n in off_rank.items() if ph != "counts"},
            "collectives": dict((forward.by_op + backward.by_op)),
            "slots_per_expert": routing.slots_per_expert(layer.num_experts),
            "dropped": routing.dropped, "slots": routing.expert.numel(),
            "off_rank_slots": int((owner != rank).sum()),
            "tokens_sent_twice": int((remote.all(dim=1) & same_rank).sum())
            if routing.expert.shape[1] == 2 else 0}


def reference_step(world_size, **config):
    """The same layer, tokens and loss in one process."""
    ref, shards, upstream = build(world_size, **config)
    xs = [s.clone().requires_grad_() for s in shards]
    outputs, aux, _ = ref(xs)
    (sum((y * dy).sum() for y, dy in zip(outputs, upstream)) + AUX_WEIGHT * aux).backward()
    return {"outputs": [y.detach() for y in outputs], "aux_loss": aux.detach(),
            "input_grads": [x.grad for x in xs], "router_grad": ref.router.weight.grad,
            "expert_grads": {f"{e}.{n}": p.grad for e, expert in enumerate(ref.experts)
                             for n, p in expert.named_parameters()}}


def assert_matches_reference(results, **config):
    """Assert every rank's output, aux loss, input gradient, router gradient and its experts'
    gradients equal the single-process layer's; return the largest difference of each."""
    ref = reference_step(len(results), **config)
    max_diff = {}

    def check(what, got, expected, rank):
        # sums over a few dozen slots in another order: float32 rounding, far below a wrong
        # gate or a lost slot (O(0.1))
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4,
                                   msg=lambda m: f"rank {rank}, {what}: {m}")
        diff = (got - expected).abs().max().item() if got.numel() else 0.0
        max_diff[what] = max(max_diff.get(what, 0.0), diff)

    for rank, res in enumerate(results):
        check("output", res["output"], ref["outputs"][rank], rank)
        check("aux loss", res["aux_loss"], ref["aux_loss"], rank)
        check("input grad", res["input_grad"], ref["input_grads"][rank], rank)
        check("router grad", res["router_grad"], ref["router_grad"], rank)
        for name, grad in res["expert_grads"].items():
            check(f"expert {name} grad", grad, ref["expert_grads"][name], rank)
    experts_checked = {n for res in results for n in res["expert_grads"]}
    assert experts_checked == set(ref["expert_grads"]), "some expert was not checked"
    return max_diff


def run_expert_parallel_check(world_size=2, **config):
    """Validate the split, run the layer on ``world_size`` ranks, assert it equals one process.
    Returns the max differences and what each rank counted."""
    validate_expert_parallel(config.get("num_experts", 4), world_size)
    ref, shards, _ = build(world_size, **config)
    gap = assert_decision_gap(ref, shards)
    # nothing here is timed, so ranks sharing cores change no result; the launcher still warns
    # when they do, as in every other section
    results = launch(expert_parallel_step, world_size=world_size, **config)
    max_diff = assert_matches_reference(results, **config)
    keys = ("bytes", "handed", "collectives", "dropped", "slots", "off_rank_slots",
            "tokens_sent_twice")
    return {"max_abs_diff": max_diff, "decision_gap": gap,
            "tokens_per_expert": sum(r["slots_per_expert"] for r in results).tolist(),
            "per_rank": [{k: r[k] for k in keys} for r in results]}


def dropped_fractions(capacity_factors, world_size=2, **config):
    """Slots dropped for capacity, counted, for each capacity factor: cf -> (dropped, slots).
    One process: routing is the same function on the same shards as on real ranks."""
    ref, shards, _ = build(world_size, **config)
    assert_decision_gap(ref, shards)     # the capacity factor does not change the decisions
    counts = {}
    with torch.no_grad():
        for cf in capacity_factors:
            ref.capacity_factor = cf
            routings = [ref.route(x) for x in shards]
            counts[cf] = (sum(r.dropped for r in routings), sum(r.expert.numel() for r in routings))
    return counts
