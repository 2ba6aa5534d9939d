"""Exercise checkers of lab 06c: one ZeRO-1 optimiser step. Registered in ``labutils.course``; notebooks call
them as ``lu.check_<name>``."""
import torch
from torch import nn

from labutils.exercises.base import make_cases, run_check
from labutils.parallel.sharding import padded, zero1_step  # noqa: F401 (the reference)


def _zero1_harness(rank, world_size, learner_fn, seed, numel, steps=2):
    torch.manual_seed(seed)
    n = padded(numel, world_size)
    pad = lambda t: torch.cat([t, torch.zeros(n - numel)])  # noqa: E731 (zeros, as flat_padded)
    start = pad(torch.randn(numel))
    grads = [[pad(torch.randn(numel)) for _ in range(world_size)] for _ in range(steps)]
    full = nn.Parameter(start.clone())  # reference: one process, mean gradient, full state
    full_opt = torch.optim.SGD([full], lr=0.1, momentum=0.9)
    for step in range(steps):
        full.grad = sum(grads[step]) / world_size
        full_opt.step()
    flat = start.clone()
    shard = nn.Parameter(flat.chunk(world_size)[rank])  # a view: updating it updates flat
    optimizer = torch.optim.SGD([shard], lr=0.1, momentum=0.9)
    for step in range(steps):
        learner_fn(rank, world_size, flat, grads[step][rank].clone(), shard, optimizer)
    return full.detach(), flat


def check_zero1_step(learner_fn, *, timeout=90.0):
    """Check ``learner_fn(rank, world_size, flat, grad, shard, optimizer)`` over two steps of
    SGD with momentum: every rank's ``flat`` equals single-process training on the mean
    gradient. No numel divides by the world size: ``flat`` ends in zero padding."""
    cases = make_cases(world_sizes=(2, 4), per_world_size=1, seed=7, numel=[9, 13, 21])
    return run_check("zero1_step", learner_fn, _zero1_harness, cases, timeout=timeout)
