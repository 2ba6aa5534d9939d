"""ZeRO stages 1-3 and FSDP2 trained on real ranks (06c1, 06c2): the problem, the runs, the bytes each
rank holds and peaks at, the check that every stage trains like plain data parallelism, and the
interleaved timing of the optimisation walk-through.

Everything is observed from outside the lesson code: the collectives by
``core.commcount.count_collectives`` (what each call was handed), the peak by
``core.memory.LiveBytes`` (every storage an op makes, counted until it dies, on whichever
thread drops it: gloo's, for a collective's buffers).
"""
import itertools
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labutils.core.commcount import count_collectives
from labutils.core.launcher import launch
from labutils.core.memory import live_peak
from labutils.core.rank import progress
from labutils.core.timing import Stats, slowest
from labutils.cost.planspec import zero_state_bytes
from labutils.data.models import mlp
from labutils.parallel.sharding import FSDP2, ShardLayout, padded, wrap


def make_problem(sizes=(32, 64, 64, 8), batch=16, seed=0):
    """The seeded MLP (``lu.models.mlp``) and one batch of inputs and class labels."""
    torch.manual_seed(seed)
    model = mlp(sizes)
    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, sizes[0], generator=generator)
    y = torch.randint(sizes[-1], (batch,), generator=generator)
    return model, x, y


def _storage_bytes(tensors):
    seen = {}
    for t in tensors:
        if t is not None and t.dim() > 0:  # Adam's scalar ``step`` counter is not state
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def held_bytes(trainer):
    """Bytes of model state this rank holds now: weights, gradients, optimiser state."""
    params = list(trainer.model.parameters()) + list(getattr(trainer, "shards", []))
    weights = getattr(trainer, "flats", None) or list(trainer.model.parameters())
    opt_state = [t for s in trainer.opt.state.values() for t in s.values()
                 if isinstance(t, torch.Tensor)]
    return {"weights": _storage_bytes(weights),
            "gradients": _storage_bytes(p.grad for p in params),
            "optimizer": _storage_bytes(opt_state)}


def padded_state_bytes(numels, world_size, stage):
    """What ``held_bytes`` counts after backward, exactly, when a parameter's ``numel`` does not
    divide by ``world_size``: each sharded tensor is padded to ``padded(numel)`` first (fp32
    Adam). Stages 1-2 keep the full weights in padded flat buffers; stage 1's full gradients
    are the unpadded ``.grad``; stage 3 pads each tensor it shards."""
    full, pad = sum(numels), sum(padded(n, world_size) for n in numels)
    weights = {0: 4 * full, 1: 4 * pad, 2: 4 * pad, 3: 4 * pad / world_size}[stage]
    grads = {0: 4 * full, 1: 4 * full, 2: 4 * pad / world_size, 3: 4 * pad / world_size}[stage]
    adam = 8 * (pad / world_size if stage else full)
    return weights + grads + adam


def paper_volume(calls):
    """Bytes of the full tensors the ``calls`` (``commcount.Call``) cover, in the paper's units
    (section 7): a reduce-scatter or an all-gather of n bytes counts n, an all-reduce 2n (it is
    one of each). A reduce-scatter is handed the full tensor, an all-gather one rank's shard."""
    total = 0
    for c in calls:
        if "allreduce" in c.op:
            total += 2 * c.nbytes
        elif "reduce_scatter" in c.op:
            total += c.nbytes
        elif "allgather" in c.op:
            total += c.nbytes * c.group_size
    return total


KINDS = {"dp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": "fsdp", "fsdp_bf16": "fsdp"}
FORMULA_STAGE = {"dp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3, "fsdp_bf16": 3}


def make_trainer(kind, model, layout, lr):
    """The trainer of ``kind`` around ``model``: ``.model``, ``.opt``, ``.step()``.
    "fsdp_bf16": FSDP2 whose all-gathered weights are bf16 (``MixedPrecisionPolicy``)."""
    if kind == "fsdp":
        return FSDP2(model, layout, lr)
    if kind == "fsdp_bf16":
        return FSDP2(model, layout, lr, param_dtype=torch.bfloat16)
    return wrap(KINDS[kind], model, layout, lr)


def _loss(model, x, y, checkpoint, autocast):
    from torch.utils.checkpoint import checkpoint_sequential
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        # checkpoint: keep only the inputs of 4 segments, recompute the rest in backward
        out = (checkpoint_sequential(model, 4, x, use_reentrant=False) if checkpoint
               else model(x))
        return F.cross_entropy(out.float(), y)


def activation_peak(model, x, y, checkpoint=False, autocast=False):
    """Measured peak (``live_peak``) of one forward and backward that makes no weight gradient:
    activations, their gradients, the loss. ZeRO shards none of it: the baseline under the
    model state."""
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    x = x.clone().requires_grad_()  # so backward runs through every layer
    try:
        return live_peak(lambda: _loss(model, x, y, checkpoint, autocast).backward())[1]
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)


def train_worker(rank, world_size, kind="dp", sizes=(32, 64, 64, 8), batch=16, steps=3,
                 lr=1e-2, seed=0, measure_memory=False, checkpoint=False, autocast=False):
    """Worker: train ``steps`` steps of ``kind`` ("dp" plain data parallel, "zero1", "zero2",
    "zero3", or "fsdp") on this rank's slice of the batch. Returns global losses, the full final
    weights, model state held after the last backward, bytes per step (paper's units, counted)
    and (``measure_memory``) the peak and the activation baseline, in bytes."""
    model, x, y = make_problem(sizes, batch, seed)
    x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
    baseline = activation_peak(model, x, y, checkpoint, autocast) if measure_memory else None
    trainer = make_trainer(kind, model, ShardLayout(rank, world_size), lr)
    state = {}

    def run():
        losses = []
        for step in range(steps):
            progress(step + 1, steps, "steps")  # rank 0 drives a panel's bar
            loss = _loss(trainer.model, x, y, checkpoint, autocast)
            loss.backward()
            if step == steps - 1 and KINDS[kind] != "fsdp":
                state.update(held_bytes(trainer))  # after backward, before the update
            trainer.step()
            losses.append(loss.detach())
        return torch.stack(losses)

    before = _weights_before(trainer, kind)
    with count_collectives() as counted:
        losses, peak = live_peak(run) if measure_memory else (run(), 0)
    params = trainer.full_parameters()
    dist.all_reduce(losses)  # the global loss: mean of the ranks' (equal-sized) batches
    return {"losses": losses / world_size, "params": params, "state": state,
            "volume_bytes_per_step": paper_volume(counted.calls) / steps,
            "peak_bytes": before + peak if measure_memory else None,
            "baseline_bytes": baseline}


def _weights_before(trainer, kind):
    """Bytes of weights the trainer holds before its first step (what ``live_peak`` does not
    see made): this rank's shards for FSDP2, the flat buffers or parameters otherwise."""
    if KINDS[kind] == "fsdp":
        return sum(p.to_local().numel() * 4 for p in trainer.model.parameters())
    return held_bytes(trainer)["weights"]


def train_single(sizes=(32, 64, 64, 8), batch=16, steps=3, lr=1e-2, seed=0, checkpoint=False,
                 autocast=False):
    """The single-process reference: the whole batch, one model, Adam."""
    model, x, y = make_problem(sizes, batch, seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
    losses = []
    for _ in range(steps):
        loss = _loss(model, x, y, checkpoint, autocast)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return {"losses": torch.stack(losses), "params": [p.detach() for p in model.parameters()]}


def single_step(sizes, batch, checkpoint=False, autocast=False, lr=1e-2, seed=0):
    """One process: build the model and Adam now; return ``step()``, one training step (the
    closure a timer calls, so building stays outside the clock)."""
    model, x, y = make_problem(sizes, batch, seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)

    def step():
        loss = _loss(model, x, y, checkpoint, autocast)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def validate_run_config(kind, world_size, batch):
    """Refuse a bad configuration before any process starts."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if batch % world_size:
        raise ValueError(f"batch {batch} does not split evenly over {world_size} ranks; use a "
                         f"batch that is a multiple of {world_size}")


def run_training(kind="dp", world_size=2, **kwargs):
    """Check the configuration, then ``train_worker`` on ``world_size`` ranks. Asserts every
    rank ends with the same weights; returns rank 0's result and every rank's peak memory."""
    validate_run_config(kind, world_size, kwargs.get("batch", 16))
    results = launch(train_worker, kind, world_size=world_size, warn_oversubscription=False,
                     **kwargs)
    for rank, res in enumerate(results[1:], 1):
        for got, expected in zip(res["params"], results[0]["params"]):
            torch.testing.assert_close(got, expected, msg=lambda m: f"rank {rank}: {m}")
    out = dict(results[0])
    out["peak_bytes_per_rank"] = [r["peak_bytes"] for r in results]
    out["baseline_bytes_per_rank"] = [r["baseline_bytes"] for r in results]
    return out


def memory_vs_formula(kinds=("dp", "zero1", "zero2", "zero3"), world_size=4, width=256,
                      depth=64, batch=8, steps=2):
    """Every ``kind`` on ``world_size`` real ranks on a square MLP of ``depth`` layers: per
    rank, the measured peak, the measured activation baseline and the formula (fp32 Adam)."""
    sizes = (width,) * (depth + 1)
    psi = sum(p.numel() for p in make_problem(sizes, batch)[0].parameters())
    rows = {}
    for kind in kinds:
        res = run_training(kind, world_size, sizes=sizes, batch=batch, steps=steps,
                           measure_memory=True)
        rows[kind] = {"peak": res["peak_bytes_per_rank"],
                      "baseline": res["baseline_bytes_per_rank"],
                      "formula": zero_state_bytes(psi, world_size, FORMULA_STAGE[kind]),
                      "losses": res["losses"]}
    # the largest tensor a step gathers or reduces at once: one Linear's weight, fp32
    return {"psi": psi, "world_size": world_size, "unit_bytes": 4 * width * width,
            "rows": rows}


def assert_same_training(result, reference, what="training"):
    """Losses of every step and every final weight equal (``torch.testing.assert_close``)."""
    torch.testing.assert_close(result["losses"], reference["losses"],
                               msg=lambda m: f"{what}, losses: {m}")
    assert len(result["params"]) == len(reference["params"]), what
    for i, (got, expected) in enumerate(zip(result["params"], reference["params"])):
        torch.testing.assert_close(got, expected, msg=lambda m: f"{what}, parameter {i}: {m}")


# ---- the walk-through: every variant in one launch, steps interleaved -------------------

def settings(variant):
    """A walk-through row ``(label, kind, flags)`` as the settings it runs with."""
    _, kind, flags = variant
    return {"sharding": kind, "checkpoint": bool(flags.get("checkpoint", False)),
            "autocast": bool(flags.get("autocast", False))}


def changes(before, after):
    """The settings in which walk-through row ``after`` differs from row ``before``."""
    a, b = settings(before), settings(after)
    return [name for name in a if a[name] != b[name]]


def validate_walk(variants):
    """Refuse a walk-through whose rows do not each change exactly one setting of the row
    above: only then do two neighbouring rows measure one change."""
    for _, kind, flags in variants:
        if kind not in KINDS or set(flags) - {"checkpoint", "autocast"}:
            raise ValueError(f"a walk-through row is (label, kind, flags) with kind one of "
                             f"{', '.join(KINDS)} and flags among checkpoint, autocast; got "
                             f"{kind!r}, {sorted(flags)}")
    for before, after in zip(variants, variants[1:]):
        changed = changes(before, after)
        if len(changed) != 1:
            raise ValueError(f"walk-through row {after[0]!r} changes {len(changed)} settings "
                             f"of the row above ({', '.join(changed) or 'none'}); change "
                             f"exactly one per row, so that its peak and time compare")


def walkthrough_worker(rank, world_size, variants, sizes, batch, repeats=5, lr=1e-2, seed=0):
    """Worker: for each variant (label, kind, flags) build its trainer (outside any clock),
    measure the peak of 2 steps, then time single steps round-robin over the variants,
    ``repeats`` rounds after one warm-up round. Returns {label: (peak bytes, [seconds])}."""
    built = {}
    for label, kind, flags in variants:
        model, x, y = make_problem(sizes, batch, seed)
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        trainer = make_trainer(kind, model, ShardLayout(rank, world_size), lr)
        before = _weights_before(trainer, kind)

        def step(trainer=trainer, x=x, y=y, flags=flags):
            _loss(trainer.model, x, y, flags.get("checkpoint", False),
                  flags.get("autocast", False)).backward()
            trainer.step()

        _, peak = live_peak(lambda step=step: [step() for _ in range(2)])
        built[label] = (step, before + peak)
    times = {label: [] for label in built}
    for i in range(repeats + 1):
        for label, (step, _) in built.items():
            dist.barrier()  # every rank starts the step together
            start = time.perf_counter()
            step()
            if i:  # round 0 warms up
                times[label].append(time.perf_counter() - start)
        progress(i + 1, repeats + 1, "rounds")
    return {label: (peak, times[label]) for label, (_, peak) in built.items()}


_WALKS = itertools.count()


def run_walkthrough(variants, world_size=2, sizes=(64,) + (128,) * 6 + (8,), batch=1024,
                    repeats=5):
    """``walkthrough_worker`` on real ranks: {label: {"peak": max over ranks, "time": Stats of
    the slowest rank's step per round}}. The Stats of one call are paired round by round (the
    variants ran in turn), so ``timing.compare`` takes per-round ratios. Each row must
    change exactly one setting of the row above (``validate_walk``, before any launch)."""
    validate_walk(variants)
    per_rank = launch(walkthrough_worker, variants, sizes, batch, repeats,
                      world_size=world_size, warn_oversubscription=False)
    rounds = f"walkthrough {next(_WALKS)}"
    return {label: {"peak": max(r[label][0] for r in per_rank),
                    "time": Stats.of(slowest([r[label][1] for r in per_rank]), rounds)}
            for label, _, _ in variants}
