"""Expert parallelism for a mixture-of-experts layer (labutils.parallel.moe, moe_router,
experiments.moe_dispatch, moe_balance; lab 06d3): the router's conventions (gates, capacity in
priority order, dropped slots, aux loss and its balanced value) on hand-made cases and against a
plain-Python router; the router collapsing without the aux loss; the layer on 2, 3 and 4 real
ranks equal to its single-process reference (outputs, aux loss, every gradient); bytes and
all-to-alls counted; our autograd all-to-all equal to PyTorch's functional one; a bad split
refused before launch; both checkers against typical mistakes."""
import math

import pytest
import torch
import torch.distributed as dist

import labutils as lu
from labutils.exercises import lab06d3
from labutils.experiments import moe_balance, moe_dispatch
from labutils.parallel import moe
from labutils.parallel.moe_router import (
    capacity,
    decision_gap,
    dispatch_indices,
    keep_within_capacity,
    route,
)

from .checkers import assert_check, checker_cases

pytestmark = pytest.mark.lab06d3


# ---- pure logic, no processes -------------------------------------------------------------

def test_capacity_is_per_source_rank_and_rounds_up():
    assert capacity(32, 4, 2, 1.0) == 16
    assert capacity(32, 4, 2, 1.25) == 20
    assert capacity(30, 4, 1, 1.0) == 8          # ceil(7.5)


def test_top2_gates_are_renormalised_and_top1_gate_is_the_probability():
    torch.manual_seed(0)
    x, w = torch.randn(10, 8), torch.randn(4, 8)
    probs = torch.softmax(x @ w.t(), -1)
    r2 = route(x, w, 2, 2.0)
    torch.testing.assert_close(r2.gate.sum(-1), torch.ones(10))
    r1 = route(x, w, 1, 4.0)
    torch.testing.assert_close(r1.gate[:, 0], probs.max(-1).values)
    assert (r1.expert[:, 0] == probs.argmax(-1)).all()


def test_slots_past_capacity_are_dropped_in_slot_order():
    # 5 tokens all prefer expert 0 (k=1, E=2): capacity ceil(1.0 * 1 * 5 / 2) = 3
    x = torch.ones(5, 2)
    w = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    r = route(x, w, 1, 1.0)
    assert r.capacity == 3
    assert r.keep[:, 0].tolist() == [True, True, True, False, False]
    assert r.dropped == 2
    assert r.slots_per_expert(2).tolist() == [5, 0]


def test_aux_loss_is_switch_equation_4():
    torch.manual_seed(1)
    x, w = torch.randn(12, 6), torch.randn(3, 6)
    r = route(x, w, 2, 1.0)
    probs = torch.softmax(x @ w.t(), -1)
    f = torch.bincount(r.expert.flatten(), minlength=3).float() / 24
    torch.testing.assert_close(r.aux_loss, 3 * (f * probs.mean(0)).sum())
    # uniform probabilities and a balanced split give exactly 1, the loss's minimum
    uniform = route(torch.zeros(4, 6), torch.zeros(2, 6), 1, 1.0)
    torch.testing.assert_close(uniform.aux_loss, torch.tensor(1.0))


@pytest.mark.parametrize("num_experts", [2, 4, 8])
def test_aux_loss_is_1_at_perfect_balance_and_E_when_everything_goes_to_one_expert(num_experts):
    # a constructed uniform routing: token t prefers expert t % E by a hair, so the load f and
    # the mean probability P are both exactly uniform: E * sum(1/E * 1/E) = 1
    h = num_experts
    x = torch.eye(h).repeat(3, 1)                              # 3E tokens, one-hot
    w = 1e-3 * torch.eye(num_experts, h)
    balanced = route(x, w, 1, float(num_experts))
    assert balanced.slots_per_expert(num_experts).tolist() == [3] * num_experts
    torch.testing.assert_close(balanced.aux_loss, torch.tensor(1.0))
    # every token to expert 0 with probability ~1: f = P = e_0, aux -> E (its maximum)
    w = torch.zeros(num_experts, h)
    w[0] = 50.0
    collapsed = route(x, w, 1, float(num_experts))
    assert collapsed.slots_per_expert(num_experts).tolist() == [3 * h] + [0] * (num_experts - 1)
    torch.testing.assert_close(collapsed.aux_loss, torch.tensor(float(num_experts)), rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("num_experts", [2, 4, 8])
def test_top2_aux_loss_peaks_at_E_over_2_and_reads_1_whenever_P_is_uniform(num_experts):
    # top-k: f counts the T*k slots, so f_i <= 1/k and E * sum(f_i P_i) <= E/k * sum(P_i) = E/k
    x = torch.ones(6, num_experts)
    w = torch.zeros(num_experts, num_experts)
    w[0], w[1] = 50.0, 49.0                                    # every token: experts 0 and 1
    collapsed = route(x, w, 2, float(num_experts))
    assert collapsed.slots_per_expert(num_experts).tolist() == [6, 6] + [0] * (num_experts - 2)
    torch.testing.assert_close(collapsed.aux_loss, torch.tensor(num_experts / 2))
    # near-uniform probabilities read ~1 however unbalanced the load: the same choices, by a hair
    flat = route(x, 1e-5 * w / 50, 2, float(num_experts))
    assert flat.slots_per_expert(num_experts).tolist() == [6, 6] + [0] * (num_experts - 2)
    torch.testing.assert_close(flat.aux_loss, torch.tensor(1.0), rtol=0, atol=1e-3)


def test_aux_loss_can_dip_below_1_when_load_and_probabilities_disagree():
    # f = (2/3, 1/3) but P = (0.34, 0.66): 2 * (2/3 * 0.34 + 1/3 * 0.66) = 0.893 < 1, so 1 is the
    # balanced value, not a bound the loss never crosses
    p = torch.tensor([[0.51, 0.49], [0.51, 0.49], [0.0001, 0.9999]], dtype=torch.double)
    r = route(p.log(), torch.eye(2, dtype=torch.double), 1, 2.0)
    assert r.slots_per_expert(2).tolist() == [2, 1]
    assert float(r.aux_loss) < 0.9


def test_without_the_aux_loss_the_router_collapses_and_with_it_stays_balanced():
    runs = moe_balance.collapse_runs(aux_weights=(0.0, 0.1), seeds=(0, 1, 2))
    for seed in (0, 1, 2):
        alone, balanced = runs[(0.0, seed)], runs[(0.1, seed)]
        # busiest expert's share over the last 10 steps: perfect balance is 1/4
        assert sum(alone["top_share"][-10:]) / 10 > 0.75
        assert sum(balanced["top_share"][-10:]) / 10 < 0.4
        assert balanced["aux_loss"][-1] < 1.1 < 1.8 < alone["aux_loss"][-1]


def _plain_route(x, w, top_k, capacity_factor, slot_order="choice"):
    """An independent router in plain Python, one token at a time: softmax by math.exp, top-k by
    sorted(), k = 2 gates renormalised, a counter per expert filled first with every token's
    first choice, then with the second choices (or, as the token-major simplification, in slot
    order t*k + j), the aux loss by loops. Returns (experts, gates, keeps) as nested lists and
    the aux loss."""
    rows, weights = x.double().tolist(), w.double().tolist()
    num_tokens, num_experts = len(rows), len(weights)
    probs = []
    for row in rows:
        logits = [sum(a * b for a, b in zip(row, wr)) for wr in weights]
        top = max(logits)
        exps = [math.exp(v - top) for v in logits]
        probs.append([v / sum(exps) for v in exps])
    experts, gates = [], []
    for p in probs:
        chosen = sorted(range(num_experts), key=lambda e: -p[e])[:top_k]
        g = [p[e] for e in chosen]
        experts.append(chosen)
        gates.append([v / sum(g) for v in g] if top_k == 2 else g)
    cap = math.ceil(capacity_factor * top_k * num_tokens / num_experts)
    used, keeps = [0] * num_experts, [[None] * top_k for _ in range(num_tokens)]
    slots = ([(t, j) for t in range(num_tokens) for j in range(top_k)] if slot_order == "token"
             else [(t, j) for j in range(top_k) for t in range(num_tokens)])
    for t, j in slots:
        e = experts[t][j]
        keeps[t][j] = used[e] < cap
        used[e] += 1
    f = [sum(row.count(i) for row in experts) / (num_tokens * top_k) for i in range(num_experts)]
    mean_p = [sum(p[i] for p in probs) / num_tokens for i in range(num_experts)]
    aux = num_experts * sum(fi * pi for fi, pi in zip(f, mean_p))
    return experts, gates, keeps, aux


@pytest.mark.parametrize("top_k", [1, 2])
def test_route_equals_an_independent_plain_python_router_with_drops(top_k):
    # the layer and its reference both call route(): this pins route() itself, shard by shard
    # (capacity per source rank), on the decisions, gates, kept slots, drop counts and aux loss
    ref, shards, _ = moe_dispatch.build(3, hidden=16, num_experts=6, top_k=top_k,
                                        capacity_factor=1.0, tokens=40, seed=5)
    total_dropped, mutant_differs = 0, False
    for x in shards:
        assert decision_gap(x, ref.router.weight, top_k) > 1e-6     # no near-tie to flip
        r = route(x, ref.router.weight, top_k, 1.0)
        experts, gates, keeps, aux = _plain_route(x, ref.router.weight, top_k, 1.0)
        assert r.expert.tolist() == experts
        torch.testing.assert_close(r.gate.double(), torch.tensor(gates, dtype=torch.double),
                                   atol=1e-6, rtol=1e-5)
        assert r.keep.tolist() == keeps
        assert r.dropped == sum(not k for row in keeps for k in row)
        torch.testing.assert_close(r.aux_loss.double(), torch.tensor(aux, dtype=torch.double),
                                   atol=1e-6, rtol=1e-5)
        total_dropped += r.dropped
        if top_k == 2:
            mutant_differs |= _plain_route(x, ref.router.weight, 2, 1.0, "token")[2] != keeps
    assert total_dropped > 0                          # the drop path is compared too
    if top_k == 2:
        # the data can tell priority from token-major order, so an ordering bug fails
        assert mutant_differs
        # and renormalisation matters here: the raw top-2 probabilities do not sum to 1
        assert not torch.allclose(torch.softmax(shards[0] @ ref.router.weight.t(), -1)
                                  .topk(2).values.sum(-1), torch.ones(40))


def test_priority_order_places_first_choices_before_second_choices():
    # E = 2, capacity 2: token 0 picks (0, 1), token 1 (1, 0), token 2 (0, 1)
    expert = torch.tensor([[0, 1], [1, 0], [0, 1]])
    # priority: firsts 0, 1, 0 fill expert 0 twice and expert 1 once; then seconds 1 (kept), 0, 1
    assert keep_within_capacity(expert, 2, 2).tolist() == [[True, True], [True, False],
                                                           [True, False]]
    # token-major: token 1's second choice (expert 0) takes token 2's first choice's place
    assert keep_within_capacity(expert, 2, 2, first_choices_first=False).tolist() == [
        [True, True], [True, True], [False, False]]


@pytest.mark.parametrize("world_size, num_experts", [(2, 4), (3, 6), (4, 8)])
def test_on_the_labs_data_token_major_drops_first_choices_that_priority_keeps(world_size,
                                                                              num_experts):
    ref, shards, _ = moe_dispatch.build(world_size, tokens=64, hidden=32, top_k=2,
                                        capacity_factor=1.0, num_experts=num_experts)
    c = moe_balance.capacity_orders(ref, shards)
    # an expert keeps min(capacity, its slots) in either order: the same number dropped
    assert c["priority"][0] == c["token-major"][0] > 0
    # priority drops a first choice only where an expert has more first choices than capacity
    firsts = [torch.bincount(route(x, ref.router.weight, 2, 1.0).expert[:, 0],
                             minlength=num_experts) for x in shards]
    cap = capacity(64, num_experts, 2, 1.0)
    assert c["priority"][1] == sum(int((n - cap).clamp_min(0).sum()) for n in firsts) == 0
    assert c["token-major"][1] == c["first choices kept only by priority"] > 0


def test_dispatch_indices_sorts_by_expert_stably_and_counts_per_rank():
    expert = torch.tensor([[3, 0], [1, 3], [0, 2]])         # slots 0..5, E=4, N=2
    order, counts = dispatch_indices(expert, 4, 2)
    assert order.tolist() == [1, 4, 2, 5, 0, 3]             # expert 0: slots 1, 4; 1: 2; ...
    assert counts.tolist() == [3, 3]


class _Recorder(torch.nn.Module):
    """An expert that records its input and tags its output with its number."""

    def __init__(self, e, seen):
        super().__init__()
        self.e, self.seen = e, seen

    def forward(self, rows):
        self.seen[self.e] = rows
        return rows * (self.e + 1)


def _received(order_fn, decisions, xs, dest, num_experts):
    """What rank ``dest`` receives from every source when each orders its slots with
    ``order_fn``, with the per-(source, local expert) counts the layer exchanges."""
    world_size, top_k = len(decisions), decisions[0].shape[1]
    local = num_experts // world_size
    rows, ids, counts = [], [], []
    for expert, x in zip(decisions, xs):
        flat = expert.flatten()
        order, _ = order_fn(expert, num_experts, world_size)
        mine = order[flat[order] // local == dest]
        rows.append(x[mine // top_k])
        ids.append(flat[mine] - dest * local)
        counts.append(torch.bincount(flat[flat // local == dest] - dest * local, minlength=local))
    return torch.cat(rows), torch.cat(ids), torch.stack(counts)


def test_layer_relies_on_the_by_expert_order_a_rank_only_order_feeds_wrong_rows():
    torch.manual_seed(3)
    num_experts, world_size, tokens, top_k = 4, 2, 12, 2
    local = num_experts // world_size
    decisions = [torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(tokens)])
                 for _ in range(world_size)]
    xs = [torch.randn(tokens, 3) for _ in range(world_size)]
    wrong = False
    for dest in range(world_size):
        expected = {e: torch.cat([x[(d.flatten() == dest * local + e).nonzero()[:, 0] // top_k]
                                  for d, x in zip(decisions, xs)]) for e in range(local)}
        seen = {}
        experts = [_Recorder(e, seen) for e in range(local)]
        rows, ids, counts = _received(dispatch_indices, decisions, xs, dest, num_experts)
        out = moe.run_local_experts(experts, rows, counts)
        for e in range(local):
            torch.testing.assert_close(seen[e], expected[e], rtol=0, atol=0)
        torch.testing.assert_close(out, rows * (ids[:, None] + 1), rtol=0, atol=0)
        rows, ids, counts = _received(_rank_only, decisions, xs, dest, num_experts)
        moe.run_local_experts(experts, rows, counts)
        wrong |= any(not torch.equal(seen[e], expected[e]) for e in range(local))
    assert wrong, "a rank-grouped-only order must give some expert the wrong rows"


def test_reference_without_drops_is_the_dense_mixture():
    torch.manual_seed(2)
    ref = moe.MoE(8, 4, top_k=2, capacity_factor=2.0)       # capacity = T: nothing dropped
    x = torch.randn(6, 8)
    with torch.no_grad():
        (y,), _, (r,) = ref([x])
        dense = x.clone()
        for t in range(6):
            for j in range(2):
                dense[t] += r.gate[t, j] * ref.experts[int(r.expert[t, j])](x[t])
    assert r.dropped == 0
    torch.testing.assert_close(y, dense)


def test_dropped_slots_never_grow_with_the_capacity_factor():
    counts = moe_dispatch.dropped_fractions([0.5, 1.0, 1.25, 2.0], world_size=2, tokens=32,
                                            num_experts=4, top_k=2)
    dropped = [counts[cf][0] for cf in (0.5, 1.0, 1.25, 2.0)]
    assert dropped == sorted(dropped, reverse=True)
    assert dropped[0] > 0                 # capacity 8 of 64 slots per expert must drop
    assert dropped[-1] == 0               # capacity 2*2*32/4 = 32 = T: an expert takes every token
    assert all(slots == 2 * 32 * 2 for _, slots in counts.values())


def test_bad_split_is_refused_before_any_process_starts(monkeypatch):
    def no_launch(*a, **k):
        raise AssertionError("a process was started for a bad configuration")
    monkeypatch.setattr(moe_dispatch, "launch", no_launch)
    with pytest.raises(ValueError, match=r"6 experts cannot be split evenly over 4 ranks.*"
                                         r"Use a world size in \[1, 2, 3, 6\]"):
        moe_dispatch.run_expert_parallel_check(4, num_experts=6)


# ---- real ranks ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("world_size, num_experts, top_k, capacity_factor", [
    (2, 4, 2, 1.0), (4, 8, 2, 1.25), (3, 6, 1, 1.0), (2, 4, 1, 1.25)])
def test_expert_parallel_equals_one_process(world_size, num_experts, top_k, capacity_factor):
    hidden = 16
    s = moe_dispatch.run_expert_parallel_check(world_size, num_experts=num_experts,
                                               top_k=top_k, capacity_factor=capacity_factor,
                                               tokens=32, hidden=hidden)
    # asserted inside (outputs, aux loss, every gradient); these are the counts beside it
    per_rank = s["per_rank"]
    assert sum(s["tokens_per_expert"]) == world_size * 32 * top_k
    for rank, r in enumerate(per_rank):
        # per-expert counts, dispatch and combine forward; the two reverse all-to-alls backward
        assert r["collectives"] == {"alltoall_base_": 5}, (rank, r["collectives"])
        # bytes to other ranks from the split sizes at the dispatcher; slots from the routing
        assert r["bytes"]["dispatch"] == r["off_rank_slots"] * hidden * 4
        assert 2 * r["tokens_sent_twice"] <= r["off_rank_slots"]
        assert top_k == 2 or r["tokens_sent_twice"] == 0
        assert r["bytes"]["dispatch backward"] == r["bytes"]["combine"]
        assert r["bytes"]["combine backward"] == r["bytes"]["dispatch"]
    sent = sum(r["bytes"]["dispatch"] + r["bytes"]["combine"] for r in per_rank)
    assert sent == 2 * sum(r["off_rank_slots"] for r in per_rank) * hidden * 4
    if capacity_factor == 1.0 and top_k == 2:
        assert sum(r["dropped"] for r in per_rank) > 0      # the drops are exercised too


def _ours_vs_functional(rank, world_size):
    from torch.distributed._functional_collectives import all_to_all_single_autograd
    send = [rank + 1 + r for r in range(world_size)]          # uneven splits
    recv = [r + 1 + rank for r in range(world_size)]
    x = torch.randn(sum(send), 3, generator=torch.Generator().manual_seed(rank))
    dy = torch.randn(sum(recv), 3, generator=torch.Generator().manual_seed(10 + rank))
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya = moe.AllToAll.apply(a, send, recv)
    yb = all_to_all_single_autograd(b, recv, send, dist.group.WORLD)
    (ya * dy).sum().backward()
    (yb * dy).sum().backward()
    return ya.detach(), yb.detach(), a.grad, b.grad


@pytest.mark.slow
def test_our_autograd_all_to_all_equals_pytorchs_functional_one():
    for ya, yb, ga, gb in lu.launch(_ours_vs_functional, world_size=3,
                                    warn_oversubscription=False):
        torch.testing.assert_close(ya, yb, rtol=0, atol=0)
        torch.testing.assert_close(ga, gb, rtol=0, atol=0)


@pytest.mark.parametrize("world_size, num_experts", [(2, 4), (3, 6), (4, 8)])
def test_decisions_survive_the_input_noise_of_another_cpu_kernel(world_size, num_experts):
    # torch.randn under ATEN_CPU_CAPABILITY=default and avx2 differs by a few float32 ulps
    # (up to 1.7e-6 at |x| ~ 4, relative ~4e-7): the lab's seeded routing must not change
    ref, shards, _ = moe_dispatch.build(world_size, tokens=64, hidden=32, top_k=2,
                                        capacity_factor=1.0, num_experts=num_experts)
    assert moe_dispatch.assert_decision_gap(ref, shards) > moe_dispatch.MIN_DECISION_GAP
    gen = torch.Generator().manual_seed(1)
    for x in shards:
        sign = torch.randint(0, 2, x.shape, generator=gen) * 2 - 1
        noisy = x + sign * 4e-7 * x.abs().clamp_min(1.0)
        assert (noisy != x).all()
        a, b = (route(t, ref.router.weight, 2, 1.0) for t in (x, noisy))
        assert torch.equal(a.expert, b.expert) and torch.equal(a.keep, b.keep)
        assert a.dropped == b.dropped


def test_a_seed_near_a_routing_tie_is_refused():
    ref, shards, _ = moe_dispatch.build(2, hidden=4, num_experts=4)
    with torch.no_grad():
        ref.router.weight[1] = ref.router.weight[0]          # experts 0 and 1 tie exactly
    with pytest.raises(AssertionError, match="of a tie"):
        moe_dispatch.assert_decision_gap(ref, shards)


# ---- the exercise -------------------------------------------------------------------------

def _per_expert(expert, num_experts, world_size):
    return torch.argsort(expert.flatten(), stable=True), torch.bincount(expert.flatten(),
                                                                        minlength=num_experts)


def _first_choice_only(expert, num_experts, world_size):
    return dispatch_indices(expert[:, :1], num_experts, world_size)


def _modulo_owner(expert, num_experts, world_size):
    flat = expert.flatten()
    order = torch.argsort(flat % world_size * num_experts + flat, stable=True)
    return order, torch.bincount(flat % world_size, minlength=world_size)


def _unstable(expert, num_experts, world_size):
    flat = expert.flatten()
    slot = torch.arange(flat.numel())
    order = torch.argsort(flat * flat.numel() - slot)         # latest slot first per expert
    return order, torch.bincount(flat // (num_experts // world_size), minlength=world_size)


def _choice_major(expert, num_experts, world_size):
    order, counts = dispatch_indices(expert.t(), num_experts, world_size)
    k = expert.shape[1]
    t = expert.shape[0]
    return (order % t) * k + order // t, counts               # first choices before second


def _rank_only(expert, num_experts, world_size):
    flat = expert.flatten()
    dest = flat // (num_experts // world_size)
    return torch.argsort(dest, stable=True), torch.bincount(dest, minlength=world_size)


def _no_minlength(expert, num_experts, world_size):
    flat = expert.flatten()
    return torch.argsort(flat, stable=True), torch.bincount(flat // (num_experts // world_size))


def _stub(expert, num_experts, world_size):
    raise NotImplementedError  # FILL ME IN


@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(lab06d3.dispatch_indices, {
    "counts_per_expert": (_per_expert, "one entry per expert"),
    "first_choice_only": (_first_choice_only, "flatten the [T, k] choices"),
    "modulo_ownership": (_modulo_owner, ("e % 2", "contiguous")),
    "unstable": (_unstable, "stable sort"),
    "choice_major": (_choice_major, "slot order t*k + j"),
    "by_rank_only": (_rank_only, "not ordered by expert"),
    "no_minlength": (_no_minlength, "minlength=N"),
    "stub": (_stub, "not implemented"),
}, passes="5 cases passed", also_right={
    "lists": lambda e, n, w: tuple(t.tolist() for t in dispatch_indices(e, n, w))}))
def test_dispatch_checker_accepts_the_reference_and_rejects_typical_mistakes(answer, verdict):
    assert_check(lu.check_dispatch_indices, answer, verdict)


# ---- the keep_within_capacity exercise (process-free) -------------------------------------

def _token_major(expert, num_experts, cap):
    return keep_within_capacity(expert, num_experts, cap, first_choices_first=False)


def _seconds_first(expert, num_experts, cap):
    return keep_within_capacity(expert.flip(1), num_experts, cap).flip(1)


def _at_most_or_equal(expert, num_experts, cap):
    return keep_within_capacity(expert, num_experts, cap + 1)


def _shared_capacity(expert, num_experts, cap):
    keep = torch.zeros(expert.numel(), dtype=torch.bool)
    keep[:cap] = True
    return keep.view_as(expert)


def _transposed(expert, num_experts, cap):
    return keep_within_capacity(expert, num_experts, cap).t()


def _keep_stub(expert, num_experts, cap):
    raise NotImplementedError  # FILL ME IN


def _one_wrong(expert, num_experts, cap):
    keep = keep_within_capacity(expert, num_experts, cap).clone()
    keep[0, 0] = ~keep[0, 0]
    return keep


@pytest.mark.parametrize("answer, verdict", checker_cases(lab06d3.keep_within_capacity, {
    "token_major": (_token_major, "token-major order t*k + j"),
    "second_choices_first": (_seconds_first, "Second choices were placed before first choices"),
    "at_most_or_equal": (_at_most_or_equal, "(<, not <=)"),
    "shared_capacity": (_shared_capacity, "applies to each expert separately"),
    "transposed": (_transposed, "it is transposed"),
    "other": (_one_wrong, "Token 0's choice 0 (expert 0) should be True, got False."),
    "stub": (_keep_stub, "not implemented"),
}, passes="4 cases passed", also_right={
    "int_mask": lambda e, n, c: keep_within_capacity(e, n, c).int()}))
def test_keep_checker_accepts_the_reference_and_rejects_typical_mistakes(answer, verdict):
    assert_check(lu.check_keep_within_capacity, answer, verdict)
