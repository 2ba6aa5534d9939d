"""Exercise checkers of lab 05: the backward half of naive model parallelism. Registered in ``labutils.course``; notebooks call
them as ``lu.check_<name>``."""
import torch
import torch.distributed as dist

from labutils.exercises.base import make_cases, run_check
from labutils.parallel.model_parallel import (
    boundary_shapes,
    make_mlp,
    naive_backward,  # noqa: F401 (the reference)
    naive_model_parallel_worker,
    reference_step,
    split_model,
)


def _naive_backward_harness(rank, world_size, learner_fn, seed, batch):
    def model_fn():
        return make_mlp(n_layers=4, width=8, in_features=5, out_features=3, seed=seed)
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(batch, 5, generator=g), torch.randn(batch, 3, generator=g)
    reference = reference_step(model_fn, x, y)
    shapes = boundary_shapes(split_model(model_fn(), world_size), x)
    got = naive_model_parallel_worker(rank, world_size, model_fn, x, y, shapes,
                                      backward_fn=learner_fn)["grads"]
    # A rank that never sends would let its peer finish and close the connection under a
    # waiting recv; with this barrier the check reports the stuck recv instead.
    dist.barrier()
    expected = {name: reference["grads"][name] for name in got}
    return expected, got


def check_naive_backward(learner_fn, *, timeout=15.0):
    """Check ``learner_fn(rank, world_size, stage_input, stage_output, loss)``: this stage's
    backward, receiving d loss / d output from rank + 1 and sending d loss / d input to rank - 1;
    every gradient on every rank must equal the single-process model's."""
    cases = make_cases(world_sizes=(2, 3, 4), per_world_size=1, seed=5, batch=[4, 6])
    return run_check("naive_backward", learner_fn, _naive_backward_harness, cases,
                     timeout=timeout)
