"""Exercise checkers of lab 04a: average gradients (the worked example), synchronise the
gradients in one message, and PyTorch's bucket rule. Registered in ``labutils.course``;
notebooks call them as ``lu.check_<name>``."""
import torch

from labutils.core.i18n import tr
from labutils.exercises.base import make_cases, run_check
from labutils.experiments.ddp_equivalence import (
    MixedNet,
    train_data_parallel,
    train_reference,
)


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


def sync_gradients(model):
    """Reference: the mean gradient over the ranks with two all-reduces whatever the number of
    parameters: which parameters got a gradient on some rank, then every such gradient in one
    flat buffer (zeros where this rank has none)."""
    import torch.distributed as dist
    params = [p for p in model.parameters() if p.requires_grad]
    used = torch.tensor([float(p.grad is not None) for p in params])
    dist.all_reduce(used)
    live = [p for p, u in zip(params, used.tolist()) if u > 0]
    for p in live:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in live])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for p, part in zip(live, flat.split([p.numel() for p in live])):
        p.grad.copy_(part.view_as(p))




def _sync_gradients_harness(rank, world_size, learner_fn, seed, aux_pattern, steps=3):
    # float64: the ranks sum in another order than one process; in float64 the difference
    # (~1e-16 relative) stays far inside the tolerance on every CPU, a wrong average does not
    expected = train_reference(steps=steps, batch_size=6 * world_size, seed=seed,
                               aux_pattern=aux_pattern, world_size=world_size,
                               dtype=torch.float64)
    got, counts = train_data_parallel(rank, world_size, "custom", steps=steps,
                                      batch_size=6 * world_size, seed=seed,
                                      aux_pattern=aux_pattern, sync=learner_fn,
                                      dtype=torch.float64)
    weights = tr("weights")
    calls = tr("all-reduce calls: at most 2 per step (usage flags, then one flat buffer)")
    return ({weights: expected, calls: True},
            {weights: got, calls: counts["allreduces"] <= 2 * steps})


def check_sync_gradients(learner_fn, *, timeout=60.0):
    """Check ``learner_fn(model)``, called after ``backward()`` on every rank: three SGD steps
    must give the weights of single-process training on the whole batch, including steps where
    the ``aux`` branch is unused on every rank or on some ranks only, with at most two
    all-reduce calls per step (counted), however many parameters the model has."""
    cases = make_cases(world_sizes=(2, 3), per_world_size=1, seed=4, aux_pattern=["even"])
    cases += make_cases(world_sizes=(2,), per_world_size=1, seed=5, aux_pattern=["rank0"])
    return run_check("sync_gradients", learner_fn, _sync_gradients_harness, cases,
                     timeout=timeout)


def torch_buckets(params, bucket_cap_mb):
    """Reference: PyTorch DDP's bucket rule. In reverse registration order, add each parameter to
    the open bucket (a parameter of another dtype opens a new one), and close the bucket once it
    has reached ``bucket_cap_mb`` MiB, so a bucket may end above the cap."""
    cap = int(bucket_cap_mb * 2**20)
    buckets, current, size = [], [], 0
    for p in reversed(list(params)):
        if current and p.dtype != current[0].dtype:
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def _torch_buckets_harness(rank, world_size, learner_fn, seed, bucket_cap_mb):
    import torch.distributed as dist
    torch.manual_seed(seed)
    model = MixedNet(hidden=[16, 32, 64][seed % 3])
    names = {id(p): n for n, p in model.named_parameters()}
    reverse = list(reversed(list(model.parameters())))
    # PyTorch's own assignment (an internal function that DDP itself calls)
    indices, _ = dist._compute_bucket_assignment_by_size(reverse, [int(bucket_cap_mb * 2**20)])
    expected = [[names[id(reverse[i])] for i in bucket] for bucket in indices]
    got = [[names.get(id(p), "?") for p in b]
           for b in learner_fn(list(model.parameters()), bucket_cap_mb)]
    return expected, got


def check_torch_buckets(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(params, bucket_cap_mb) -> list of lists of parameters`` against the
    buckets PyTorch's DDP assigns (its own function computes the expected ones)."""
    cases = make_cases(world_sizes=(2,), per_world_size=3, seed=1,
                       bucket_cap_mb=[0.001, 0.004, 0.02, 0.07, 25.0])
    return run_check("torch_buckets", learner_fn, _torch_buckets_harness, cases,
                     timeout=timeout)
