"""Exercise checkers of lab 03c: shard a global batch. Registered in ``labutils.course``; notebooks call
them as ``lu.check_<name>``."""
import dis
import math
import types

import torch
import torch.distributed as dist

from labutils.core.i18n import tr
from labutils.data import train
from labutils.exercises.base import CheckResult, make_cases, run_check


def shard_batch(batch, rank, world_size):
    """Exercise reference: ``(local_batch, loss_weight)`` for rank ``rank``."""
    local = torch.tensor_split(batch, world_size)[rank]   # contiguous, sizes differ by at most 1
    # DDP divides the sum of the ranks' gradients by world_size: a rank's mean loss must count
    # its len(local) samples as len(local) / len(batch) of the whole, times world_size.
    return local, world_size * len(local) / len(batch)


def _weight_verdict(weight, needed, local, n, world_size):
    """(expected, got) words for the loss weight a learner returned: equal when it is right,
    else what is wrong with it, never the right number (that is the exercise). Each under 58
    characters, so that the checker's message shows them whole."""
    weight = float(weight)
    if math.isclose(weight, needed, rel_tol=1e-4, abs_tol=1e-5):
        return tr("right for this shard"), tr("right for this shard")
    if math.isclose(weight, 1.0, rel_tol=1e-4, abs_tol=1e-5):
        return (tr("a weight that depends on the size of this shard"),
                tr("1: a plain average over-weights the smaller shard"))
    values = {"weight": weight, "local": local, "n": n, "ws": world_size}
    if weight > needed:
        return (tr("the weight for the size of this shard"),
                tr("{weight:.3g}: too large for {local} of {n} samples on {ws} ranks", **values))
    return (tr("the weight for the size of this shard"),
            tr("{weight:.3g}: too small for {local} of {n} samples on {ws} ranks", **values))


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
    right, verdict = _weight_verdict(weight, needed, len(xs), n, world_size)
    samples, gradient, loss_weight = tr("samples"), tr("gradient"), tr("loss weight")
    return ({samples: exactly_one, loss_weight: right, gradient: expected_grads},
            {samples: coverage, loss_weight: verdict, gradient: got_grads})


# the library's own answer, which lab 03c's training loop (lu.show_source(lu.train._fit)) calls
_LIBRARY = {"shard_weight": train.shard_weight, "shard_batch": train.shard_batch}


def _delegates(fn, code=None):
    """The library function ``fn`` calls for its weight, if any (by name, or as an attribute
    such as ``lu.train.shard_weight``, in nested functions too); None if it computes it itself."""
    for ins in dis.get_instructions(code or fn.__code__):
        name = ins.argval
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and name in _LIBRARY:
            return name
        if (ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and name in _LIBRARY
                and fn.__globals__.get(name, _LIBRARY[name]) is _LIBRARY[name]):
            return name   # imported from the library, not the student's own function
        if isinstance(name, types.CodeType):
            nested = _delegates(fn, name)
            if nested:
                return nested
    return None


def check_shard_batch(learner_fn, *, timeout=60.0):
    """Check ``learner_fn(batch, rank, world_size) -> (local_batch, loss_weight)``: every sample
    on exactly one rank, and the ranks' averaged gradient of ``weight * mean loss`` equal to the
    single-process gradient on the whole batch (global sizes that do and do not divide)."""
    used = _delegates(learner_fn) if isinstance(learner_fn, types.FunctionType) else None
    if used:
        return CheckResult(False, tr("[wrong] shard_batch: it calls the library's {name}; compute "
                                     "the weight yourself from the shard's size", name=used))
    cases = [{"world_size": 2, "seed": 1, "n": 7}, {"world_size": 3, "seed": 2, "n": 10},
             *make_cases(world_sizes=(2, 3), per_world_size=1, seed=3, n=[6, 9, 11])]
    return run_check("shard_batch", learner_fn, _shard_batch_harness, cases, timeout=timeout)
