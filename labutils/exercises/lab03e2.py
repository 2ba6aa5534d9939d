"""Exercise checkers of lab 03e2: the bytes of a model's states (weights, gradients, optimiser
state, fp32 master copy) for a given optimiser and precision. Registered in ``labutils.course``;
notebooks call them as ``lu.check_<name>``."""
import torch

from labutils.core.i18n import tr
from labutils.core.memory import OPTIMIZER_STATES
from labutils.data.models import mlp
from labutils.exercises.base import CheckResult, call_learner, require_function

_OPTIMIZERS = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1),
               "momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
               "adam": lambda p: torch.optim.Adam(p, lr=0.1)}


def model_states(num_params, optimizer, dtype_bytes):
    """Reference: bytes of weights + gradients + optimiser state for ``num_params`` parameters
    (ZeRO, section 3): weights and gradients in the training dtype, the optimiser's state in
    fp32 (``k`` values per parameter: SGD 0, momentum 1, Adam 2), and, in lower precision, an
    fp32 master copy of the weights (what the optimiser updates)."""
    master = 1 if dtype_bytes < 4 else 0
    return num_params * (2 * dtype_bytes + 4 * (OPTIMIZER_STATES[optimizer] + master))


def counted_model_states(sizes, optimizer):
    """The same bytes counted on a real fp32 step of ``mlp(sizes)``: every parameter, every
    gradient and every optimiser state tensor PyTorch allocated (Adam's 0-d step counters aside:
    one number per tensor, not per parameter)."""
    model = mlp(sizes, seed=0)
    opt = _OPTIMIZERS[optimizer](list(model.parameters()))
    model(torch.randn(4, sizes[0])).sum().backward()
    opt.step()
    params = list(model.parameters())
    state = [t for s in opt.state.values() for t in s.values()
             if torch.is_tensor(t) and t.dim() > 0]
    return (sum(p.nbytes for p in params) + sum(p.grad.nbytes for p in params)
            + sum(t.nbytes for t in state))


def _mistakes(n, optimizer, dtype_bytes):
    """Typical wrong answers for this case, each with what is wrong with it. Some give the same
    number in some cases (all are multiples of ``n``): the checker then names each of them."""
    k = OPTIMIZER_STATES[optimizer]
    master = 1 if dtype_bytes < 4 else 0
    if optimizer == "adam":
        wrong = [(n * (2 * dtype_bytes + 4 * (1 + master)),
                  tr("Adam keeps two fp32 values per parameter (exp_avg, exp_avg_sq)"))]
    else:
        wrong = [(n * (2 * dtype_bytes + 4 * (1 - k + master)),
                  tr("SGD keeps no state; momentum keeps one buffer per parameter"))]
    wrong += [(n * (dtype_bytes + 4 * (k + master)),
               tr("the gradients are missing: backward keeps one per weight, in the weights' "
                  "dtype"))]
    if master:
        wrong += [(n * (2 * dtype_bytes + dtype_bytes * (k + master)),
                   tr("the optimiser state and master copy are fp32 (4 bytes), whatever the "
                      "weights' dtype")),
                  (n * (2 * dtype_bytes + 4 * k),
                   tr("mixed precision keeps an fp32 master copy of the weights for the "
                      "optimiser"))]
    else:
        wrong += [(n * (2 * dtype_bytes + 4 * (k + 1)),
                   tr("an fp32 model needs no master copy: its weights are fp32 already"))]
    return wrong


# (sizes of a real MLP, optimiser) counted in fp32; (parameters, optimiser, bytes) by formula
_COUNTED = (((64, 32, 10), "sgd"), ((64, 32, 10), "momentum"), ((16, 8, 8, 4), "adam"))
_FORMULA = ((1_000, "adam", 2), (2_000, "sgd", 2), (3_000, "momentum", 2),
            (1_557_611_200, "adam", 2))


def _cases():
    for sizes, optimizer in _COUNTED:
        n = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
        yield (n, optimizer, 4), (lambda s=sizes, o=optimizer: counted_model_states(s, o)), \
            tr("counted on a real step")
    for n, optimizer, dtype_bytes in _FORMULA:
        yield (n, optimizer, dtype_bytes), (
            lambda n=n, o=optimizer, d=dtype_bytes: model_states(n, o, d)), \
            tr("ZeRO's formula")


def check_model_states(learner_fn):
    """Check ``learner_fn(num_params, optimizer, dtype_bytes) -> bytes`` of weights, gradients
    and optimiser state: fp32 cases against the bytes a real step allocates, 2-byte cases
    against ZeRO's formula (no processes needed)."""
    require_function("model_states", learner_fn)
    cases = list(_cases())
    for number, ((n, optimizer, dtype_bytes), reference, source) in enumerate(cases, 1):
        case = f"num_params={n}, optimizer={optimizer!r}, dtype_bytes={dtype_bytes}"
        where = tr("[wrong] {name}: case {number} of {total} ({case})", name="model_states",
                   number=number, total=len(cases), case=case)
        got, failed = call_learner("model_states", learner_fn, where, n, optimizer, dtype_bytes)
        if failed:
            return failed
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return CheckResult(False, tr("{where}: expected a number of bytes, got {type} "
                                         "{got!r}", where=where, type=type(got).__name__,
                                         got=got), {"case": case})
        expected = reference()
        if got == expected:
            continue
        named = [text for wrong, text in _mistakes(n, optimizer, dtype_bytes) if wrong == got]
        why = (tr("; or ").join(named) if named else
               tr("off by a factor {factor:.3g}", factor=got / expected))
        return CheckResult(False, tr("{where}: expected {expected} bytes ({source}), got "
                                     "{got:g}: {why}", where=where, expected=expected,
                                     source=source, got=got, why=why), {"case": case})
    return CheckResult(True, tr("[ok] {name}: {n} cases passed, fp32 ones equal to the bytes a "
                                "real step allocates", name="model_states", n=len(cases)))

