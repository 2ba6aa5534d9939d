"""ZeroOptimizer (labutils.parallel.zero_optimizer, lab 06c1): ZeRO stages 1 and 2 as a
torch.optim.Optimizer. On 2 and 3 real ranks (no parameter size divides by either: padding
everywhere) with a tied embedding/head, AdamW with weight decay and SGD with momentum under an
lr scheduler train like the unsharded optimizer on one process over the whole batch (also with
gradient clipping: the sharded global norm against PyTorch's clip_grad_norm_), and like
PyTorch's ZeroRedundancyOptimizer + DDP; each rank holds optimiser state for its shard only;
stage 2 leaves no full gradient; two backward passes per step accumulate; a step issues one
reduce-scatter and one all-gather per parameter, counted from outside (count_collectives); a
per-rank state_dict resumes training as if uninterrupted. Equal means torch.testing.assert_close
with its default tolerances, in float64 (see _problem: why not float32)."""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import labutils as lu
from labutils.core.commcount import count_collectives
from labutils.parallel.zero_optimizer import ZeroOptimizer, flat_padded, padded

pytestmark = pytest.mark.lab06c1

BATCH, STEPS = 12, 4
OPTIMIZERS = {"adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
              "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01))}


class TiedNet(nn.Module):
    """Embedding -> Linear -> head whose weight *is* the embedding's: 55, 25 + 5 and 11
    elements, none divisible by 2 or 3."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 5)
        self.hidden = nn.Linear(5, 5)
        self.head = nn.Linear(5, 11)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        return self.head(torch.tanh(self.hidden(self.emb(idx))))


def _problem(seed=0):
    # float64: the sharded sums (2 or 3 partial sums of 6 or 4 samples) and the one-process sum
    # of 12 add in different orders. In float32 that differs by up to ~12 * 2**-24 relative,
    # by a different amount on each CPU's math library, and AdamW divides each gradient by its
    # own size, so near-zero elements turn it into weight differences near assert_close's fp32
    # tolerance. In float64 the same reordering costs ~12 * 2**-53 relative: 8 orders of
    # magnitude inside the float64 tolerance (1e-7), while a real bug (a missing average, a
    # wrong shard) is off by O(1).
    torch.manual_seed(seed)
    model = TiedNet().double()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(11, (STEPS, BATCH), generator=g)
    y = torch.randint(11, (STEPS, BATCH), generator=g)
    return model, x, y


def _train(model, opt, x, y, steps, rank=0, world_size=1, sched=None, start=0, clip=None,
           norms=None):
    """``clip``: called between backward and step, returns the gradient norm (into ``norms``)."""
    losses = []
    for step in range(start, start + steps):
        xs, ys = x[step].chunk(world_size)[rank], y[step].chunk(world_size)[rank]
        loss = F.cross_entropy(model(xs), ys)
        loss.backward()
        if clip is not None:
            norms.append(clip())
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def _global(losses, world_size):
    dist.all_reduce(losses)  # equal local batches: the mean of means is the global mean
    return losses / world_size


def reference(opt_name, max_norm=None):
    """One process, the whole batch, the unsharded optimizer, the same scheduler (and the
    same gradient clipping, PyTorch's)."""
    model, x, y = _problem()
    cls, kw = OPTIMIZERS[opt_name]
    opt = cls(model.parameters(), **kw)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.7)
    norms = []
    clip = None if max_norm is None else (
        lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    losses = _train(model, opt, x, y, STEPS, sched=sched, clip=clip, norms=norms)
    return {"losses": losses, "params": dict(model.named_parameters()), "norms": norms}


def _zero_worker(rank, world_size, opt_name, stage, max_norm=None):
    model, x, y = _problem()
    cls, kw = OPTIMIZERS[opt_name]
    # the tied weight listed a second time: sharded once, one optimiser state
    opt = ZeroOptimizer([*model.parameters(), model.head.weight], cls, stage=stage, **kw)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.7)  # lr changes reach the shards
    facts = {"n_shards": len(opt.shards),
             "shard_numels": [s.numel() for s in opt.shards],
             "padded_numels": [padded(p.numel(), world_size) for p in model.parameters()]}
    loss = F.cross_entropy(model(x[0].chunk(world_size)[rank]), y[0].chunk(world_size)[rank])
    loss.backward()
    facts["full_grads_after_backward"] = sum(p.grad is not None for p in model.parameters())
    opt.zero_grad()
    facts["grads_after_zero_grad"] = sum(t.grad is not None for t in opt.params + opt.shards)
    norms = []
    clip = None if max_norm is None else (lambda: opt.clip_grad_norm_(max_norm))
    losses = _train(model, opt, x, y, STEPS, rank, world_size, sched, clip=clip, norms=norms)
    facts["norms"] = norms
    assert opt.state is opt.optim.state
    facts["state_numels"] = sorted({t.numel() for s in opt.state.values()
                                    for t in s.values() if torch.is_tensor(t) and t.dim()})
    facts["inner_lr"] = opt.optim.param_groups[0]["lr"]
    return {"losses": _global(losses, world_size), "params": dict(model.named_parameters()),
            **facts}


def _assert_same(got, want, what):
    torch.testing.assert_close(got["losses"], want["losses"], msg=lambda m: f"{what}, losses: {m}")
    assert got["params"].keys() == want["params"].keys()
    for name, p in want["params"].items():
        torch.testing.assert_close(got["params"][name], p,
                                   msg=lambda m, name=name: f"{what}, {name}: {m}")


# ---- pure logic ---------------------------------------------------------------------------

def test_padding():
    assert [padded(n, 3) for n in (6, 7, 11)] == [6, 9, 12]
    assert flat_padded(torch.arange(5.0), 3).tolist() == [0, 1, 2, 3, 4, 0]
    t = torch.arange(6.0)
    assert flat_padded(t, 3).data_ptr() == t.data_ptr()  # divides evenly: a view, no copy


def test_stage_refused_before_any_collective():
    with pytest.raises(ValueError, match="stages 1 and 2; got stage=3"):
        ZeroOptimizer([nn.Parameter(torch.ones(2))], torch.optim.SGD, stage=3, lr=0.1)


def test_same_training_comparison_can_fail():
    ref = reference("sgd")
    wrong = {"losses": ref["losses"], "params": {**ref["params"]}}
    wrong["params"]["hidden.bias"] = wrong["params"]["hidden.bias"] + 1e-3
    with pytest.raises(AssertionError, match="hidden.bias"):
        _assert_same(wrong, ref, "wrong")


# ---- real ranks ---------------------------------------------------------------------------

MAX_NORM = 0.5  # below every step's gradient norm here (asserted): clipping always acts
CASES = [(o, s, None) for o in OPTIMIZERS for s in (1, 2)] + [("adamw", s, MAX_NORM)
                                                             for s in (1, 2)]


def _all_cases(rank, world_size):
    return {case: _zero_worker(rank, world_size, *case) for case in CASES}


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_equals_the_unsharded_optimizer_on_one_process(world_size):
    results = lu.launch(_all_cases, world_size=world_size, warn_oversubscription=False)
    for opt_name, stage, max_norm in CASES:
        ref = reference(opt_name, max_norm)
        what = f"{opt_name}, stage {stage}, clip {max_norm}, {world_size} ranks"
        if max_norm is not None:
            assert min(ref["norms"]) > max_norm
        for rank, res in enumerate(results):
            got = res[(opt_name, stage, max_norm)]
            _assert_same(got, ref, f"{what}, rank {rank}")
            torch.testing.assert_close(got["norms"], ref["norms"])  # the global norm
            assert got["n_shards"] == 4  # emb/head weight, hidden weight and bias, head bias
            # optimiser state held per rank: exactly one padded shard of each parameter
            assert got["shard_numels"] == [n // world_size for n in got["padded_numels"]]
            assert got["state_numels"] == sorted(set(got["shard_numels"]))
            assert got["full_grads_after_backward"] == (4 if stage == 1 else 0), what
            assert got["grads_after_zero_grad"] == 0
            lr = OPTIMIZERS[opt_name][1]["lr"]  # the scheduler's last change reaches the next step
            assert got["inner_lr"] == pytest.approx(lr * 0.7 ** (STEPS - 1))


def _versus_torch(rank, world_size, stage):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    model, x, y = _problem()
    ddp = DDP(model)
    ref = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2,
                                  weight_decay=0.1)
    torch_losses = _global(_train(ddp, ref, x, y, STEPS, rank, world_size), world_size)
    torch_params = {n: p.detach().clone() for n, p in model.named_parameters()}
    model, x, y = _problem()
    ours = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=stage, lr=1e-2,
                         weight_decay=0.1)
    losses = _global(_train(model, ours, x, y, STEPS, rank, world_size), world_size)
    return ({"losses": losses, "params": dict(model.named_parameters())},
            {"losses": torch_losses, "params": torch_params})


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2])
def test_equals_zero_redundancy_optimizer_with_ddp(stage):
    for rank, (ours, theirs) in enumerate(lu.launch(_versus_torch, stage, world_size=2)):
        _assert_same(ours, theirs, f"stage {stage} vs ZeroRedundancyOptimizer+DDP, rank {rank}")


def _resume(rank, world_size, stage):
    """Two steps, save (weights: any rank; optimiser: this rank's), two more; then a fresh
    model and optimizer load the saved state and run the same two steps."""
    model, x, y = _problem()
    opt = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=stage, lr=1e-2,
                        weight_decay=0.1)
    _train(model, opt, x, y, 2, rank, world_size)
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    straight = _train(model, opt, x, y, 2, rank, world_size, start=2)
    model2, _, _ = _problem(seed=1)  # different initial weights, overwritten by the load
    model2.load_state_dict(saved_model)
    opt2 = ZeroOptimizer(model2.parameters(), torch.optim.AdamW, stage=stage, lr=1.0)
    opt2.load_state_dict(saved_opt)  # also restores lr=1e-2 and weight_decay
    resumed = _train(model2, opt2, x, y, 2, rank, world_size, start=2)
    wrong_rank = {**saved_opt, "zero": {**saved_opt["zero"], "rank": 1 - rank}}
    try:
        opt2.load_state_dict(wrong_rank)
        refused = ""
    except ValueError as e:
        refused = str(e)
    return ({"losses": straight, "params": dict(model.named_parameters())},
            {"losses": resumed, "params": dict(model2.named_parameters())}, refused)


@pytest.mark.slow
def test_per_rank_state_dict_resumes_as_if_uninterrupted_and_refuses_another_ranks_file():
    for rank, (straight, resumed, refused) in enumerate(
            lu.launch(_resume, 2, world_size=2)):
        _assert_same(resumed, straight, f"resumed vs uninterrupted, rank {rank}")
        assert "state is per rank" in refused


def _one_counted_step(rank, world_size, stage):
    model, x, y = _problem()
    opt = ZeroOptimizer(model.parameters(), torch.optim.SGD, stage=stage, lr=0.1)
    with count_collectives() as counted:
        xs, ys = x[0].chunk(world_size)[rank], y[0].chunk(world_size)[rank]
        F.cross_entropy(model(xs), ys).backward()
        opt.step()
    calls = [(c.op, c.nbytes, c.group_size) for c in counted.calls]
    return dict(counted.by_op), calls, [padded(p.numel(), world_size) * p.element_size()
                                        for p in model.parameters()]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2])
def test_one_reduce_scatter_and_one_all_gather_per_parameter(stage):
    for by_op, calls, padded_bytes in lu.launch(_one_counted_step, stage, world_size=2):
        assert by_op == {"_reduce_scatter_base_": 4, "_allgather_base_": 4}
        # each call covers one padded parameter: the reduce-scatter is handed the full tensor,
        # the all-gather one rank's shard of it (2 psi in all, in the paper's units)
        assert sorted(b for op, b, _ in calls if op == "_reduce_scatter_base_") == sorted(padded_bytes)
        assert sorted(b * n for op, b, n in calls if op == "_allgather_base_") == sorted(padded_bytes)
        assert all(n == 2 for _, _, n in calls)


def _accumulated(rank, world_size, stage):
    """Each step as two half-batch backward passes (loss / 2 each), then one step."""
    model, x, y = _problem()
    opt = ZeroOptimizer(model.parameters(), torch.optim.SGD, stage=stage,
                        **OPTIMIZERS["sgd"][1])
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.7)
    losses = []
    for step in range(STEPS):
        xs, ys = x[step].chunk(world_size)[rank], y[step].chunk(world_size)[rank]
        loss = torch.zeros((), dtype=torch.float64)
        for a, b in zip(xs.chunk(2), ys.chunk(2)):
            part = F.cross_entropy(model(a), b) / 2
            part.backward()  # stage 2: reduce-scattered now, summed into the shards
            loss += part.detach()
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(loss.detach())
    return {"losses": _global(torch.stack(losses), world_size),
            "params": dict(model.named_parameters())}


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2])
def test_gradient_accumulation_over_two_backward_passes(stage):
    ref = reference("sgd")
    for rank, res in enumerate(lu.launch(_accumulated, stage, world_size=2)):
        _assert_same(res, ref, f"stage {stage}, two micro-batches, rank {rank}")
