"""Exercise checkers of lab 04b: gradient accumulation under no_sync, over micro-batches of
different sizes. Registered in ``labutils.course``; notebooks call them as ``lu.check_<name>``."""
import re

import torch
from torch import nn

from labutils.core.i18n import tr
from labutils.exercises.base import make_cases, run_check
from labutils.experiments.ddp_equivalence import MixedNet, make_batches


def no_sync_accumulation(ddp_model, micro_batches, loss_fn):
    """Reference: the gradient of the mean loss over every sample of every micro-batch, whatever
    their sizes (each micro-batch's mean loss weighted by its share of the samples), with one
    all-reduce round: the last backward."""
    total = sum(len(X) for X, _ in micro_batches)
    *first, (X, y) = micro_batches
    with ddp_model.no_sync():
        for Xb, yb in first:
            (loss_fn(ddp_model(Xb), yb) * len(Xb) / total).backward()
    (loss_fn(ddp_model(X), y) * len(X) / total).backward()   # all-reduces the sum


def _no_sync_harness(rank, world_size, learner_fn, seed, micro_batches, uneven=True):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.manual_seed(seed)
    model = MixedNet()
    # micro-batches of different sizes per rank (2, 4, 6, 2, ...), as the last one of an epoch
    # can be; ``uneven=False``: 4 samples each
    sizes = [2 + 2 * (i % 3) if uneven else 4 for i in range(micro_batches)]
    batches = [make_batches(1, s * world_size, seed=seed * 100 + i)[0]
               for i, s in enumerate(sizes)]
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
    mine = [(Xb[rank * s:(rank + 1) * s], yb[rank * s:(rank + 1) * s])
            for (Xb, yb), s in zip(batches, sizes)]
    # micro-batch i of the large batch = every rank's slice of batches i: the same samples
    learner_fn(ddp_model, mine, nn.functional.mse_loss)
    gradients, passes = tr("gradients"), tr("backward passes that all-reduced")
    expected = {gradients: {n: p.grad for n, p in reference.named_parameters()}, passes: 1}
    got = {gradients: {n: p.grad for n, p in model.named_parameters()},
           passes: calls.count(0)}  # bucket 0 opens each round
    if uneven and _equal_weights(reference, batches, got[gradients]):
        got[_EQUAL_WEIGHTS] = True   # the typical mistake: check_ names it, not an element
    return expected, got


_EQUAL_WEIGHTS = "equal weights"   # a marker key, never shown


def _equal_weights_message():
    return tr("the micro-batches hold different numbers of samples, but your gradients weight "
              "them equally: the mean of their mean losses is not the mean over every sample")


def _equal_weights(reference, batches, grads):
    """True when ``grads`` are those of the mean of the micro-batches' mean losses (each
    weighted 1/k), which differ from the right ones when the sizes differ."""
    wrong = type(reference)()
    wrong.load_state_dict(reference.state_dict())
    wrong.zero_grad(set_to_none=True)
    loss = sum(nn.functional.mse_loss(wrong(X), y) for X, y in batches) / len(batches)
    loss.backward()
    return all(g is not None and torch.allclose(g, p.grad, rtol=1e-4, atol=1e-6)
               for (_, p), g in zip(wrong.named_parameters(), grads.values()))


def check_no_sync_accumulation(learner_fn, *, timeout=60.0):
    """Check ``learner_fn(ddp_model, micro_batches, loss_fn)`` on micro-batches of different
    sizes: afterwards ``.grad`` holds the gradient of the mean loss over every sample of every
    rank, and DDP all-reduced only once (in the last backward)."""
    cases = make_cases(world_sizes=(2, 3), per_world_size=1, seed=7, micro_batches=[2, 3, 4])
    result = run_check("no_sync_accumulation", learner_fn, _no_sync_harness, cases,
                       timeout=timeout)
    if not result.passed and repr(_EQUAL_WEIGHTS) in result.message:
        # the failing case, then the rank's difference: ": rank 0, ..." ("：rank 0，..." in
        # Chinese), which the diagnosis replaces
        rank = re.search(r"([:：] ?)rank \d", result.message)
        where, sep = result.message[:rank.start()], rank.group(1)
        return type(result)(False, f"{where}{sep}{_equal_weights_message()}", result.case)
    return result
