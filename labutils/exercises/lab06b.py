"""Exercise checkers of lab 06b: a column-parallel linear layer. Registered in ``labutils.course``; notebooks call
them as ``lu.check_<name>``."""
import torch
from torch import nn

from labutils.exercises.base import make_cases, run_check
from labutils.parallel.tensor_parallel import TPLayout, column_parallel_linear, shard  # noqa: F401 (the reference, for show_solution)


def _column_parallel_harness(rank, world_size, learner_fn, seed, batch, in_features,
                             out_features):
    torch.manual_seed(seed)
    x = torch.randn(batch, in_features)
    linear = nn.Linear(in_features, out_features)
    layout = TPLayout(rank, world_size)
    with torch.no_grad():
        expected = linear(x)
        got = learner_fn(rank, world_size, x.clone(), shard(linear.weight, layout, 0),
                         shard(linear.bias, layout, 0))
    return expected, got


def check_column_parallel_linear(learner_fn, *, timeout=90.0):
    """Check ``learner_fn(rank, world_size, x, weight_shard, bias_shard)``: from this rank's
    rows of W and b, it returns the full output ``x W^T + b`` on every rank."""
    cases = make_cases(world_sizes=(2, 4), per_world_size=1, seed=6, batch=[3, 5],
                       in_features=[4, 6], out_features=[8, 16])
    return run_check("column_parallel_linear", learner_fn, _column_parallel_harness, cases,
                     timeout=timeout)
