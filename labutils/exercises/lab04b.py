"""Exercise checkers of lab 04b: gradient accumulation under no_sync. Registered in ``labutils.course``; notebooks call
them as ``lu.check_<name>``."""
import torch
from torch import nn

from labutils.exercises.base import make_cases, run_check
from labutils.experiments.ddp_equivalence import MixedNet, make_batches


def _no_sync_harness(rank, world_size, learner_fn, seed, micro_batches):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.manual_seed(seed)
    model = MixedNet()
    batches = make_batches(micro_batches, 4 * world_size, seed=seed)
    reference = MixedNet()
    reference.load_state_dict(model.state_dict())
    X = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    nn.functional.mse_loss(reference(X), y).backward()  # one process, the whole large batch
    ddp_model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.02)
    calls = []

    def counting_hook(state, bucket):
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)
    ddp_model.register_comm_hook(None, counting_hook)
    mine = [(Xb[rank * 4:(rank + 1) * 4], yb[rank * 4:(rank + 1) * 4]) for Xb, yb in batches]
    # micro-batch i of the large batch = rank r's slices of batches i: the same samples
    learner_fn(ddp_model, mine, nn.functional.mse_loss)
    expected = {"gradients": {n: p.grad for n, p in reference.named_parameters()},
                "backward passes that all-reduced": 1}
    got = {"gradients": {n: p.grad for n, p in model.named_parameters()},
           "backward passes that all-reduced": calls.count(0)}  # bucket 0 opens each round
    return expected, got


def check_no_sync_accumulation(learner_fn, *, timeout=60.0):
    """Check ``learner_fn(ddp_model, micro_batches, loss_fn)``: afterwards ``.grad`` holds the
    gradient of the mean loss over all micro-batches of all ranks, and DDP all-reduced each
    only once (in the last backward)."""
    cases = make_cases(world_sizes=(2, 3), per_world_size=1, seed=7, micro_batches=[2, 3, 4])
    return run_check("no_sync_accumulation", learner_fn, _no_sync_harness, cases,
                     timeout=timeout)
