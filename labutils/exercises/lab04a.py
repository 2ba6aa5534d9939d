"""Exercise checkers of lab 04a: average gradients (the worked example), synchronise gradients, assign buckets. Registered in ``labutils.course``; notebooks call
them as ``lu.check_<name>``."""
import torch

from labutils.exercises.base import make_cases, run_check
from labutils.experiments.ddp_equivalence import (
    MixedNet,
    train_data_parallel,
    train_reference,
)
from labutils.parallel.ddp import assign_buckets


def average_gradients(model, world_size):
    """Reference: replace every gradient with its mean over the ranks (in place)."""
    import torch.distributed as dist
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad /= world_size


def _tiny_model_grads(seed, rank, n):
    """The gradients rank ``rank`` computes on its own batch of ``n`` samples."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randn(n, 4, generator=generator)
    y = torch.randn(n, 2, generator=generator)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return model


def _average_gradients_harness(rank, world_size, learner_fn, seed, n):
    # Reference computed in this single process: every rank's batch is rebuilt here.
    grads = [dict(_tiny_model_grads(seed, r, n).named_parameters()) for r in range(world_size)]
    expected = {name: sum(g[name].grad for g in grads) / world_size for name in grads[0]}
    model = _tiny_model_grads(seed, rank, n)
    learner_fn(model, world_size)
    got = {name: (p.grad.clone() if p.grad is not None else None)
           for name, p in model.named_parameters()}
    return expected, got


def check_average_gradients(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(model, world_size)``: after it, every ``.grad`` on every rank is the
    mean of that gradient over all ranks."""
    cases = make_cases(world_sizes=(2, 3, 4), per_world_size=1, seed=4, n=[3, 5, 8])
    return run_check("average_gradients", learner_fn, _average_gradients_harness, cases,
                     timeout=timeout)


def _sync_gradients_harness(rank, world_size, learner_fn, seed, aux_pattern):
    expected = train_reference(steps=3, batch_size=6 * world_size, seed=seed,
                               aux_pattern=aux_pattern, world_size=world_size)
    got, _ = train_data_parallel(rank, world_size, "custom", steps=3, batch_size=6 * world_size,
                                 seed=seed, aux_pattern=aux_pattern, sync=learner_fn)
    return expected, got


def check_sync_gradients(learner_fn, *, timeout=60.0):
    """Check ``learner_fn(model)``, called after ``backward()`` on every rank: three SGD steps
    must give the weights of single-process training on the whole batch, including steps where
    the ``aux`` branch is unused on every rank or on some ranks only."""
    cases = make_cases(world_sizes=(2, 3), per_world_size=1, seed=4, aux_pattern=["even"])
    cases += make_cases(world_sizes=(2,), per_world_size=1, seed=5, aux_pattern=["rank0"])
    return run_check("sync_gradients", learner_fn, _sync_gradients_harness, cases,
                     timeout=timeout)


def _assign_buckets_harness(rank, world_size, learner_fn, seed, bucket_cap_mb):
    torch.manual_seed(seed)
    model = MixedNet(hidden=[16, 32, 64][seed % 3])
    names = {id(p): n for n, p in model.named_parameters()}
    expected = [[names[id(p)] for p in b] for b in assign_buckets(model.parameters(),
                                                                   bucket_cap_mb)]
    got = [[names.get(id(p), "?") for p in b]
           for b in learner_fn(list(model.parameters()), bucket_cap_mb)]
    return expected, got


def check_assign_buckets(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(params, bucket_cap_mb) -> list of lists of parameters``: buckets of
    at most ``bucket_cap_mb`` MiB (a bigger parameter gets a bucket of its own), filled in
    reverse order of registration."""
    cases = make_cases(world_sizes=(2,), per_world_size=3, seed=1,
                       bucket_cap_mb=[0.001, 0.004, 0.02, 0.07, 25.0])
    return run_check("assign_buckets", learner_fn, _assign_buckets_harness, cases,
                     timeout=timeout)
