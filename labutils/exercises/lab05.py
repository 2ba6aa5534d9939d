"""Exercise checkers of lab 05: the backward half of naive model parallelism, and the number of
micro-batches that brings a pipeline's idle share below a target. Registered in
``labutils.course``; notebooks call them as ``lu.check_<name>``."""
import numbers

import torch
import torch.distributed as dist

from labutils.core.i18n import tr
from labutils.cost.step_time import bubble_fraction
from labutils.exercises.base import CheckResult, make_cases, not_implemented, run_check
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


# ---- exercise 3: how many micro-batches keep the idle share below a target ------------------

def _smallest(p, max_idle, idle):
    m = 1
    while idle(p, m) >= max_idle:
        m += 1
    return m


def min_microbatches(p, max_idle):
    """The smallest m whose idle share (p-1)/(m+p-1) is below ``max_idle``."""
    return _smallest(p, max_idle, bubble_fraction)


def _mistakes():
    """Typical wrong answers, each with what is wrong with it (tried in this order)."""
    return (
        (lambda p, t: _smallest(p, t, lambda p, m: (p - 1) / (m + p - 1) - 1e-12),
         tr("at that m the idle share equals the target; below means strictly less (<, not "
            "<=)")),
        (lambda p, t: _smallest(p, t, lambda p, m: p / (m + p)),
         tr("that is the m for p/(m+p); the idle share of p stages is (p-1)/(m+p-1): p-1 slots "
            "of fill and drain, not p")),
        (lambda p, t: _smallest(p, t, lambda p, m: (p - 1) / m),
         tr("that makes (p-1)/m small enough; the idle share divides by the whole step, m+p-1 "
            "slots")),
    )


_CASES = ((4, 0.10), (2, 0.25), (3, 0.2), (5, 0.3), (8, 0.05))


def check_min_microbatches(learner_fn):
    """Check ``learner_fn(p, max_idle)``: the smallest number of micro-batches m with
    (p-1)/(m+p-1) below ``max_idle``, for several p and targets (no processes needed)."""
    if not callable(learner_fn):
        raise TypeError(tr("check_min_microbatches needs your function itself, e.g. "
                           "lu.check_min_microbatches(my_min_microbatches)"))
    for number, (p, t) in enumerate(_CASES, 1):
        where = tr("[wrong] {name}: case {number} of {total} ({case})", name="min_microbatches",
                   number=number, total=len(_CASES), case=f"p={p}, max_idle={t}")
        try:
            got = learner_fn(p, t)
        except NotImplementedError:
            return CheckResult(False, not_implemented("min_microbatches"))
        except Exception as e:   # noqa: BLE001 (report any error as the learner's)
            return CheckResult(False, tr("{where}: raised {error}: {message}", where=where,
                                         error=type(e).__name__, message=e))
        expected = min_microbatches(p, t)
        if isinstance(got, float) and 0 < got < 1:
            return CheckResult(False, tr("{where}: got {got:.3g}, which looks like an idle "
                                         "share; return the number of micro-batches m (an int)",
                                         where=where, got=got))
        if not isinstance(got, numbers.Integral) or isinstance(got, bool):
            return CheckResult(False, tr("{where}: expected an int (a number of micro-batches), "
                                         "got {type} {got!r}", where=where,
                                         type=type(got).__name__, got=got))
        got = int(got)                 # numpy and torch integers are fine too
        if got == expected:
            continue
        why = next((text for wrong, text in _mistakes() if wrong(p, t) == got), None)
        if why is None and got > expected:
            why = tr("m={m} already gives {idle:.3g}: return the smallest m", m=expected,
                     idle=bubble_fraction(p, expected))
        elif why is None:
            why = tr("with m={m} the idle share is {idle:.3g}, not below {t}", m=got,
                     idle=bubble_fraction(p, got), t=t)
        return CheckResult(False, f"{where}: " + tr("expected {e}, got {g}", e=expected, g=got)
                           + f": {why}", {"p": p, "max_idle": t})
    return CheckResult(True, tr("[ok] {name}: {total} cases passed", name="min_microbatches",
                                total=len(_CASES)))
