"""Zero3Module (labutils.parallel.zero3, lab 06c2): ZeRO stage 3 on module hooks. The course's
CharGPT with its head tied to the token embedding, AdamW with weight decay on the fp32 master
shards: on 2 and 3 real ranks (3: padding) every step of several trains like one process over
the whole batch (float64, within the bound of the reordered sum; at 3 with gradient clipping:
the sharded global norm), AdamW on the shards like AdamW on whole tensors, bit for bit; like
PyTorch's FSDP2 (``fully_shard`` on each Block and the root), in fp32 and with bf16 compute;
during forward a rank holds its shards plus the root's and one other unit's full weights (two
others during backward), and none after backward; each unit is all-gathered twice per step
and its gradient reduce-scattered once, counted."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten

import labutils as lu
from labutils.core.commcount import count_collectives
from labutils.data.models import Block
from labutils.experiments.zero_components import STEPS, adamw, gpt_problem
from labutils.parallel.zero3 import Zero3Module
from labutils.parallel.zero_optimizer import all_gather_into, clip_grad_norm_

pytestmark = pytest.mark.lab06c2


EVERY_UNIT = {Block, nn.Embedding, nn.Linear}
# bf16 weights and activations (8 significant bits) against fp32 on one process: the looser
# bound. A weight moves about lr = 1e-2 per AdamW step; after 3 steps the largest difference
# seen was 0.023 (losses 0.015 apart), against 0.05 + 0.05 * |weight| allowed.
BF16 = dict(atol=5e-2, rtol=5e-2)


# the lab's problem: a 2-block CharGPT with its head tied to the token embedding, and AdamW
_problem, _opt = gpt_problem, adamw



def _train(model, opt, x, y, rank=0, world_size=1, clip=None, norms=None):
    """``clip``: called between backward and step, returns the gradient norm (into ``norms``)."""
    losses = []
    for step in range(STEPS):
        xs, ys = x[step].chunk(world_size)[rank], y[step].chunk(world_size)[rank]
        loss = F.cross_entropy(model(xs).float().flatten(0, 1), ys.flatten())
        loss.backward()
        if clip is not None:
            norms.append(clip())
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    losses = torch.stack(losses)
    if world_size > 1:
        torch.distributed.all_reduce(losses)
    return losses / world_size


def reference(max_norm=None):
    model, x, y = _problem()
    norms = []
    clip = None if max_norm is None else (
        lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    losses = _train(model, _opt(model.parameters()), x, y, clip=clip, norms=norms)
    return {"losses": losses, "params": {n: p.detach() for n, p in model.named_parameters()},
            "norms": norms}


def _assert_same(got, want, what, **tol):
    torch.testing.assert_close(got["losses"], want["losses"], **tol,
                               msg=lambda m: f"{what}, losses: {m}")
    assert got["params"].keys() == want["params"].keys()
    for name, p in want["params"].items():
        torch.testing.assert_close(got["params"][name], p, **tol,
                                   msg=lambda m, name=name: f"{what}, {name}: {m}")


def _ours(rank, world_size, unit=EVERY_UNIT, compute_dtype=None, max_norm=None):
    model, x, y = _problem()
    model = Zero3Module(model, unit=unit, compute_dtype=compute_dtype)
    norms = []
    clip = None if max_norm is None else (
        lambda: clip_grad_norm_(model.parameters(), max_norm))  # on the gradient shards
    losses = _train(model, _opt(model.parameters()), x, y, rank, world_size, clip, norms)
    return {"losses": losses, "params": model.full_parameters(), "norms": norms,
            "units": [u.names for u in model.units]}


def test_same_training_comparison_can_fail():
    ref = reference()
    wrong = {"losses": ref["losses"], "params": dict(ref["params"])}
    wrong["params"]["ln_f.bias"] = wrong["params"]["ln_f.bias"] + 1e-3
    with pytest.raises(AssertionError, match="ln_f.bias"):
        _assert_same(wrong, ref, "wrong")


U = 2.0 ** -24  # fp32 unit roundoff


def _gathered_grads(model):
    """{name: full gradient}, all-gathered from every rank's shard ``.grad`` (a collective)."""
    out = {}
    for u in model.units:
        flat = torch.empty(u.full.numel(), dtype=torch.float32)
        all_gather_into(flat, u.shard.grad)
        out.update({n: v.clone() for n, v in zip(u.names, u.views(flat))})
    return out


def _ours_steps(rank, world_size, max_norm=None):
    """``_ours``, recording every step: the full weights before it, the mean loss, the averaged
    gradient as the reduce-scatter left it, the norm and the gradient after clipping."""
    model, x, y = _problem()
    model = Zero3Module(model, unit=EVERY_UNIT)
    opt = _opt(model.parameters())
    steps = []
    for step in range(STEPS):
        record = {"params": model.full_parameters()}
        xs, ys = x[step].chunk(world_size)[rank], y[step].chunk(world_size)[rank]
        loss = F.cross_entropy(model(xs).flatten(0, 1), ys.flatten())
        loss.backward()
        record["grads"] = _gathered_grads(model)
        if max_norm is not None:
            record["norm"] = clip_grad_norm_(model.parameters(), max_norm)  # on the shards
        record["clipped"] = _gathered_grads(model)
        opt.step()
        opt.zero_grad()
        loss = loss.detach()
        torch.distributed.all_reduce(loss)
        record["loss"] = loss / world_size
        steps.append(record)
    return {"steps": steps, "final": model.full_parameters(),
            "units": [u.names for u in model.units]}


def _exact(params, xs, ys):
    """One process, whole batch, float64 at the weights ``params``: the mean loss and its
    gradient, exact to ~1e-16 relative, with the sizes of the terms the batch mean adds:
    ``S[name]``, per element the mean over the N tokens of |that token's gradient|, and
    ``loss_terms``, the mean of |logsumexp| + |target logit| (a token's loss is their
    difference)."""
    model, _, _ = _problem()
    model.double()
    named = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in named.items():
            p.copy_(params[name])
    logits = model(xs).flatten(0, 1)                                   # (N, vocab)
    per_token = F.cross_entropy(logits, ys.flatten(), reduction="none")  # (N,)
    grads = [torch.autograd.grad(loss, list(named.values()), retain_graph=True)
             for loss in per_token]                                   # N x per-token gradient
    per_name = {name: torch.stack([g[i] for g in grads]) for i, name in enumerate(named)}
    target = logits.gather(1, ys.flatten()[:, None]).squeeze(1)
    return {"loss": per_token.mean().item(), "n": per_token.numel(),
            "loss_terms": (torch.logsumexp(logits, 1).abs() + target.abs()).mean().item(),
            "grads": {n: g.mean(0) for n, g in per_name.items()},
            "S": {n: g.abs().mean(0) for n, g in per_name.items()}}


def _assert_step_equals_one_process(step, exact, max_norm, what):
    """One step of ours against the exact one-process step at the same weights.

    The averaged gradient is a sum over the batch's N tokens, taken in another order than one
    process takes it (each rank sums its tokens in its GEMMs, the reduce-scatter sums the
    ranks in gloo's order), and each CPU's math library picks its own order inside a GEMM. Any
    order of a sum of N terms t_n errs by at most (N-1)*U*sum|t_n| (Higham, Accuracy and
    Stability, 4.2), plus U per scaling by 1/N, 1/world_size: so per element
    |ours - exact| <= (N + 2) * U * S, S = mean over tokens of |t_n| (computed in float64).
    Each term also carries the rounding of the layers it went through (the token embedding's
    the deepest): |ours - exact| / (U * S) reached 13 (ours on 2 and 3 ranks, and one fp32
    process summing the batch in 1, 2, 3 or 6 slices), within N + 2 = 50. A missing 1/world_size
    or a wrong shard errs by about |exact|, far beyond 50 * U * S ~ 3e-6 * S.
    """
    n = exact["n"]
    for name, want in exact["grads"].items():
        got = step["grads"][name].double()
        bound = (n + 2) * U * exact["S"][name]
        excess = (got - want).abs() - bound
        assert excess.max() <= 0, (
            f"{what}, gradient of {name}: off by {(got - want).abs().max():.3g}, "
            f"{excess.max():.3g} beyond the bound (N + 2) * U * S")
    # the loss: the same mean over N tokens of logsumexp - target logit
    assert abs(step["loss"].item() - exact["loss"]) <= (n + 2) * U * exact["loss_terms"], what
    if max_norm is None:
        assert all(torch.equal(step["clipped"][k], g) for k, g in step["grads"].items()), what
        return
    # the norm: ||ours|| is within ||ours - exact|| (bounded above) of ||exact||, and its
    # sum of P positive squares errs by at most P * U relative in any order
    bound_sq = sum(((n + 2) * U * s).pow(2).sum() for s in exact["S"].values())
    exact_norm = torch.cat([g.flatten() for g in exact["grads"].values()]).norm()
    own_norm = torch.cat([g.double().flatten() for g in step["grads"].values()]).norm()
    p = own_norm.new_tensor(sum(g.numel() for g in step["grads"].values()))
    assert exact_norm > max_norm, what  # clipping acts at every step
    assert abs(step["norm"].double() - exact_norm) <= bound_sq.sqrt() + p * U * own_norm, what
    # clipping scales every element by one fp32 scalar, PyTorch's formula: bit for bit
    scale = (max_norm / (step["norm"] + 1e-6)).clamp(max=1.0)
    for name, g in step["grads"].items():
        assert torch.equal(step["clipped"][name], g * scale), f"{what}, clipped {name}"


@pytest.mark.slow
@pytest.mark.parametrize("world_size, max_norm", [(2, None), (3, 0.5)])
def test_equals_one_process(world_size, max_norm, one_thread):
    """Step by step rather than the end weights after STEPS steps: AdamW divides each
    gradient by its own running magnitude, so where a gradient element is nearly zero, last-bit
    differences between summation orders (those of this CPU's math library) become visible
    weight differences, and the end weights have no bound derived from the sum. Each step is
    checked from the weights ours reached: its gradient, loss and norm against one process in
    float64 within the summation bound, then AdamW, fed ours' gradients, against ours' step."""
    results = lu.launch(_ours_steps, world_size=world_size, max_norm=max_norm,
                        warn_oversubscription=False)
    for rank, res in enumerate(results[1:], 1):  # every rank gathered the same bytes
        for got, want in zip(res["steps"] + [res["final"]],
                             results[0]["steps"] + [results[0]["final"]]):
            assert all(map(torch.equal, tree_flatten(got)[0], tree_flatten(want)[0])), rank
    res = results[0]
    model, x, y = _problem()  # the single-process AdamW, fed ours' averaged gradients
    named = dict(model.named_parameters())
    opt = _opt(model.parameters())
    for step, (record, after) in enumerate(zip(res["steps"],
                                               [s["params"] for s in res["steps"][1:]]
                                               + [res["final"]])):
        what = f"ZeRO-3 on {world_size} ranks, step {step}"
        if step == 0:
            assert all(torch.equal(record["params"][n], p) for n, p in named.items()), what
        _assert_step_equals_one_process(record, _exact(record["params"], x[step], y[step]),
                                        max_norm, what)
        for name, p in named.items():
            p.grad = record["clipped"][name].clone()
        opt.step()
        # AdamW on a shard or on the whole tensor: the same element-wise operations in the
        # same order on each element, so the same bits
        for name, p in named.items():
            assert torch.equal(after[name], p.detach()), f"{what}, AdamW on {name}"
    # the tied weight lives in the root (last): the token embedding has no unit of its own,
    # the head's unit holds only its bias
    units = res["units"]
    assert [u[:1] for u in units] == [["pos_emb.weight"], ["blocks.0.ln1.weight"],
                                      ["blocks.1.ln1.weight"], ["head.bias"], ["tok_emb.weight"]]
    assert sum(map(len, units)) == len(named)


def _fsdp2(rank, world_size, bf16):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    model, x, y = _problem()
    mesh = init_device_mesh("cpu", (world_size,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                  reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    losses = _train(model, _opt(model.parameters()), x, y, rank, world_size)
    theirs = {"losses": losses,
              "params": {n: p.full_tensor().detach() for n, p in model.named_parameters()}}
    ours = _ours(rank, world_size, unit={Block}, compute_dtype=torch.bfloat16 if bf16 else None)
    return ours, theirs


@pytest.mark.slow
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_equals_fsdp2(bf16):
    ref = reference()
    for rank, (ours, theirs) in enumerate(lu.launch(_fsdp2, bf16, world_size=2)):
        # the same casts and the same fp32 reduction as FSDP2: default fp32 tolerances, bf16 too
        _assert_same(ours, theirs, f"ZeRO-3 vs FSDP2, rank {rank}")
        if bf16:
            _assert_same(ours, ref, f"bf16 ZeRO-3 vs fp32 one process, rank {rank}", **BF16)


def _gathered(rank, world_size):
    model, x, y = _problem()
    model = Zero3Module(model, unit=EVERY_UNIT)
    seen, seen_backward = [], []

    def after_forward(m, args, out):
        seen.append(model.gathered_bytes())
        if torch.is_tensor(out) and out.requires_grad:  # fires after our re-gather hook
            out.register_hook(lambda grad: seen_backward.append(model.gathered_bytes()))

    for m in model.module.modules():  # after ours: a unit's pre-hook has gathered it by now
        m.register_forward_pre_hook(lambda m, a: seen.append(model.gathered_bytes()))
        m.register_forward_hook(after_forward)
    with count_collectives() as counted:
        loss = F.cross_entropy(model(x[0]).flatten(0, 1), y[0].flatten())
        after_forward = model.gathered_bytes()
        loss.backward()
    sizes = [u.full.numel() * u.full.element_size() for u in model.units]
    return {"peak": max(seen), "peak_backward": max(seen_backward), "after_forward": after_forward,
            "after_backward": model.gathered_bytes(), "sizes": sizes,
            "shard_grads": [u.shard.grad.numel() for u in model.units],
            "shards": [u.shard.numel() for u in model.units], "counted": dict(counted.by_op)}


@pytest.mark.slow
def test_full_weights_freed_between_units():
    for res in lu.launch(_gathered, world_size=2):
        *others, root = res["sizes"]
        assert res["peak"] <= root + max(others)  # never two non-root units at once
        assert res["peak"] < sum(res["sizes"])    # so less than the whole model
        assert res["peak"] >= root + min(others)  # the hooks did run inside the units
        # backward: a unit is gathered before the previous one's gradient is reduced
        assert res["peak_backward"] <= root + sum(sorted(others)[-2:]) < sum(res["sizes"])
        assert res["after_forward"] == 0 and res["after_backward"] == 0
        assert res["shard_grads"] == res["shards"] == [s // 4 // 2 for s in res["sizes"]]
        # each unit: gathered for forward, again for backward, its gradient reduce-scattered
        units = len(res["sizes"])
        assert res["counted"] == {"_allgather_base_": 2 * units,
                                  "_reduce_scatter_base_": units}
