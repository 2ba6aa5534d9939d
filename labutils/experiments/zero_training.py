"""ZeRO stages 1-3 and FSDP2 trained on real ranks (06c): the problem, the runs, the bytes each
rank holds, and the check that every stage trains like plain data parallelism."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from labutils.core.launcher import launch
from labutils.core.memory import measure_peak
from labutils.core.rank import progress
from labutils.data.models import mlp
from labutils.parallel.sharding import FSDP2, VOLUME_FACTOR, ShardLayout, wrap
from labutils.parallel.tensor_parallel import CommCounter


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


KINDS = {"dp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": "fsdp"}


def _loss(model, x, y, checkpoint, autocast):
    from torch.utils.checkpoint import checkpoint_sequential
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        # checkpoint: keep only the inputs of 4 segments, recompute the rest in backward
        out = (checkpoint_sequential(model, 4, x, use_reentrant=False) if checkpoint
               else model(x))
        return F.cross_entropy(out.float(), y)


def train_worker(rank, world_size, kind="dp", sizes=(32, 64, 64, 8), batch=16, steps=3,
                 lr=1e-2, seed=0, measure_memory=False, checkpoint=False, autocast=False):
    """Worker: train ``steps`` steps of ``kind`` ("dp" plain data parallel, "zero1", "zero2",
    "zero3", or "fsdp") on this rank's slice of the batch. Returns global losses, the full final
    weights, model state held after the last backward, bytes per step (paper's units), median
    step time and (optionally) peak memory."""
    import time
    model, x, y = make_problem(sizes, batch, seed)
    layout = ShardLayout(rank, world_size, counter=CommCounter())
    x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
    trainer = (FSDP2(model, layout, lr) if kind == "fsdp"
               else wrap(KINDS[kind], model, layout, lr))
    state, times = {}, []

    def run():
        losses = []
        for step in range(steps):
            progress(step + 1, steps, "steps")  # rank 0 drives a panel's bar
            start = time.perf_counter()
            loss = _loss(trainer.model, x, y, checkpoint, autocast)
            loss.backward()
            if step == steps - 1 and kind != "fsdp":
                state.update(held_bytes(trainer))  # after backward, before the update
            trainer.step()
            times.append(time.perf_counter() - start)
            losses.append(loss.detach())
        return torch.stack(losses)

    before = (sum(p.to_local().numel() * 4 for p in trainer.model.parameters())
              if kind == "fsdp" else held_bytes(trainer)["weights"])
    if measure_memory:
        losses, peak = measure_peak(run)
    else:
        losses, peak = run(), 0
    volume = sum(VOLUME_FACTOR[op] * b for op, _, b in layout.counter.records) / steps
    params = trainer.full_parameters()
    if measure_memory:  # time as many steps again without the profiler (it slows every op)
        times.clear()
        run()
    dist.all_reduce(losses)  # the global loss: mean of the ranks' (equal-sized) batches
    return {"losses": losses / world_size, "params": params,
            "state": state, "volume_bytes_per_step": volume,
            "step_time": sorted(times[1:] or times)[len(times[1:] or times) // 2],
            "peak_bytes": before + peak if measure_memory else None}


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
    return out


def assert_same_training(result, reference, what="training"):
    """Losses of every step and every final weight equal (``torch.testing.assert_close``)."""
    torch.testing.assert_close(result["losses"], reference["losses"],
                               msg=lambda m: f"{what}, losses: {m}")
    assert len(result["params"]) == len(reference["params"]), what
    for i, (got, expected) in enumerate(zip(result["params"], reference["params"])):
        torch.testing.assert_close(got, expected, msg=lambda m: f"{what}, parameter {i}: {m}")
