"""Exercise checkers of lab 03c: shard a global batch. Registered in ``labutils.course``; notebooks call
them as ``lu.check_<name>``."""
import torch
import torch.distributed as dist

from labutils.core.i18n import tr
from labutils.data.train import shard_batch  # noqa: F401 (the reference)
from labutils.exercises.base import make_cases, run_check


def _shard_batch_harness(rank, world_size, learner_fn, seed, n):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    g = torch.Generator().manual_seed(seed)
    X, y = torch.randn(n, 3, generator=g), torch.randn(n, 2, generator=g)
    torch.nn.functional.mse_loss(model(X), y).backward()
    # named as the model's parameters, not to be confused with the loss weight the learner returns
    expected_grads = {f"Linear.{k}": p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    # Which samples did each rank take? Shard the sample numbers themselves.
    mine, _ = learner_fn(torch.arange(n), rank, world_size)
    everyone = [None] * world_size
    dist.all_gather_object(everyone, [int(i) for i in mine])
    taken = [i for ids in everyone for i in ids]
    missing = [i for i in range(n) if i not in taken]
    twice = sorted({i for i in taken if taken.count(i) > 1})
    exactly_one = tr("each sample on exactly one rank")
    coverage = (exactly_one if not missing and not twice else
                tr("sample {i} on no rank", i=missing[0]) if missing else
                tr("sample {i} on two ranks", i=twice[0]))
    (xs, weight), (ys, _) = learner_fn(X, rank, world_size), learner_fn(y, rank, world_size)
    (torch.nn.functional.mse_loss(model(xs), ys) * weight).backward()
    for p in model.parameters():  # what DDP does: average the gradients over the ranks
        dist.all_reduce(p.grad)
        p.grad /= world_size
    got_grads = {f"Linear.{k}": p.grad.clone() for k, p in model.named_parameters()}
    # the one weight that makes DDP's average of the ranks' mean losses the global mean loss
    needed = world_size * len(xs) / n
    samples, gradient, loss_weight = tr("samples"), tr("gradient"), tr("loss weight")
    return ({samples: exactly_one, loss_weight: torch.tensor(needed, dtype=torch.float64),
             gradient: expected_grads},
            {samples: coverage, loss_weight: torch.as_tensor(weight, dtype=torch.float64),
             gradient: got_grads})


def check_shard_batch(learner_fn, *, timeout=60.0):
    """Check ``learner_fn(batch, rank, world_size) -> (local_batch, loss_weight)``: every sample
    on exactly one rank, and the ranks' averaged gradient of ``weight * mean loss`` equal to the
    single-process gradient on the whole batch (global sizes that do and do not divide)."""
    cases = [{"world_size": 2, "seed": 1, "n": 7}, {"world_size": 3, "seed": 2, "n": 10},
             *make_cases(world_sizes=(2, 3), per_world_size=1, seed=3, n=[6, 9, 11])]
    return run_check("shard_batch", learner_fn, _shard_batch_harness, cases, timeout=timeout)
