"""Exercise checkers of lab 01: an all-reduce with another operation; the FLOPs of an MLP's
training step, predicted by hand and compared with PyTorch's count. Registered in
``labutils.course``; notebooks call them as ``lu.check_<name>``."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from labutils.core.i18n import tr
from labutils.data.models import mlp
from labutils.exercises.base import CheckResult, make_cases, not_implemented, run_check

# ---- exercise 1: every rank ends with the elementwise maximum --------------------------------


def start(rank, world_size):
    """Rank r's tensor before the collective: [r + 1, 2 (world_size - r)]. No rank starts with
    the maximum of both elements, so an answer that leaves a rank's tensor alone shows."""
    return torch.tensor([rank + 1.0, 2.0 * (world_size - rank)])


def max_allreduce(rank, world_size):
    """Reference: every rank ends with the elementwise maximum of all ranks' tensors."""
    t = start(rank, world_size)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def _max():
    return tr("the elementwise max over all ranks")


def _what(t, rank, world_size):
    """Name what a rank's tensor holds, so a wrong answer hears what it did instead (each name
    stays under 60 characters: the checker's message prints it whole)."""
    every = torch.stack([start(r, world_size) for r in range(world_size)])
    named = ((every.max(0).values, _max()),
             (every.sum(0), tr("the sum: all_reduce sums unless op=ReduceOp.MAX")),
             (start(rank, world_size), tr("its own start: no collective changed it")),
             (every.min(0).values, tr("the min over all ranks (ReduceOp.MIN)")))
    for value, name in named:
        if t.shape == value.shape and torch.equal(t, value):
            return name
    return tr("{values}: not the max", values=[round(v, 3) for v in t.tolist()][:4])


def _max_allreduce_harness(rank, world_size, learner_fn, seed):
    got = learner_fn(rank, world_size)
    if not isinstance(got, torch.Tensor):
        returns = tr("returns")
        return ({returns: tr("a tensor")},
                {returns: tr("{type}: return the tensor", type=type(got).__name__)})
    return ({tr("holds"): _max()},
            {tr("holds"): _what(got.detach().float().reshape(-1), rank, world_size)})


def check_max_allreduce(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(rank, world_size)``: on every rank it returns the elementwise maximum
    of the ranks' tensors ``start(r, world_size)``, on 2 and 3 ranks."""
    cases = make_cases(world_sizes=(2, 3), per_world_size=1, seed=1)
    return run_check("max_allreduce", learner_fn, _max_allreduce_harness, cases, timeout=timeout)


# ---- exercise 2: FLOPs of one training step of an MLP, per sample ----------------------------


def mlp_flops_per_sample(sizes):
    """Reference: FLOPs of one forward and backward pass of ``mlp(sizes)``, per sample.

    Each ``Linear(a, b)`` is one (batch x a) @ (a x b) matmul forward, 2ab FLOPs per sample, and
    one of the same size backward for its weight gradient. Every layer but the first also needs
    the gradient of its input (one more 2ab); the first layer's input is the data, which needs
    none, so autograd skips it. Bias adds and ReLUs are not matmuls (PyTorch's counter, like
    most FLOP counts, counts matmuls and convolutions)."""
    pairs = list(zip(sizes[:-1], sizes[1:]))
    return sum(6 * a * b for a, b in pairs) - 2 * pairs[0][0] * pairs[0][1]


def counted_flops_per_sample(sizes, batch=8):
    """What ``torch.utils.flop_counter.FlopCounterMode`` counts for one forward and backward
    pass of ``mlp(sizes)`` on ``batch`` samples, divided by ``batch``."""
    model = mlp(sizes, seed=0)
    x, y = torch.randn(batch, sizes[0]), torch.randint(sizes[-1], (batch,))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() // batch


def _weights(sizes):
    return sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))


def _params(sizes):
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


# Typical wrong answers, each with what is wrong with it (tried in this order).
def _flop_mistakes():
    return (
        (lambda s: 2 * _weights(s), tr("that is the forward pass alone; backward does two more "
                                       "matmuls per layer (weight gradient and input gradient)")),
        (lambda s: 4 * _weights(s), tr("forward and the weight gradients; every layer but the "
                                       "first also computes the gradient of its input")),
        (lambda s: 6 * _weights(s), tr("6 x weights counts the first layer's input gradient "
                                       "too; the data does not require grad, so autograd skips "
                                       "that matmul")),
        (lambda s: 6 * _params(s), tr("6 x parameters is the standard 6ND estimate, right to "
                                      "first order; the exact count is smaller: some "
                                      "parameters do no matmul work, and backward skips one "
                                      "matmul. Which ones?")),
        (lambda s: 2 * _params(s), tr("that is about the forward pass alone, biases included; "
                                      "backward does more, and bias adds are not counted")),
    )


_FLOP_CASES = ((64, 128, 128, 128, 10), (3, 5), (10, 20, 30, 4), (784, 256, 10))


def check_mlp_flops_per_sample(learner_fn):
    """Check ``learner_fn(sizes)`` against the FLOPs PyTorch counts for one forward and backward
    pass of ``lu.models.mlp(sizes)``, per sample (no processes needed)."""
    if not callable(learner_fn):
        raise TypeError(tr("check_mlp_flops_per_sample needs your function itself, e.g. "
                           "lu.check_mlp_flops_per_sample(my_flops)"))
    for number, sizes in enumerate(_FLOP_CASES, 1):
        where = tr("[wrong] {name}: case {number} of {total} ({case})",
                   name="mlp_flops_per_sample", number=number, total=len(_FLOP_CASES),
                   case=f"sizes={sizes}")
        try:
            got = learner_fn(sizes)
        except NotImplementedError:
            return CheckResult(False, not_implemented("mlp_flops_per_sample"))
        except Exception as e:  # noqa: BLE001 (report any error as the learner's)
            return CheckResult(False, tr("{where}: raised {error}: {message}", where=where,
                                         error=type(e).__name__, message=e))
        expected = counted_flops_per_sample(sizes)
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return CheckResult(False, tr("{where}: expected a number of FLOPs, got {type} "
                                         "{got!r}", where=where, type=type(got).__name__,
                                         got=got), {"sizes": sizes})
        if got == expected:
            continue
        why = next((text for wrong, text in _flop_mistakes() if wrong(sizes) == got),
                   tr("off by a factor {factor:.3g}", factor=got / expected) if expected else "")
        return CheckResult(False, tr("{where}: expected {expected} (PyTorch's count), got "
                                     "{got:g}: {why}", where=where, expected=expected, got=got,
                                     why=why), {"sizes": sizes})
    return CheckResult(True, tr("[ok] {name}: {n} cases passed, equal to FlopCounterMode's "
                                "count", name="mlp_flops_per_sample", n=len(_FLOP_CASES)))
