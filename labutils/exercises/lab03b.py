"""Exercise checker of lab 03b: one update of asynchronous SGD with a stale gradient.
Registered in ``labutils.course``; notebooks call it as ``lu.check_stale_update``."""
import torch

from labutils.core.i18n import tr
from labutils.exercises.base import run_check


def stale_update(history, grad_fn, lr, staleness):
    """Reference: the weights after the next update of a parameter server whose gradient was
    taken ``staleness`` updates ago. ``history`` is [w_0, ..., w_t]; the gradient is taken at
    w_(t - staleness) (at w_0 while fewer updates exist) and applied to the newest weights."""
    t = len(history) - 1
    return history[-1] - lr * grad_fn(history[max(0, t - staleness)])


def _problem(seed, t, dim=5):
    """Weights of versions 0..t and a quadratic loss's gradient, all from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    history = [torch.randn(dim, generator=g, dtype=torch.float64) for _ in range(t + 1)]
    A = torch.randn(dim, dim, generator=g, dtype=torch.float64)
    A, b = A @ A.T + torch.eye(dim, dtype=torch.float64), torch.randn(dim, generator=g,
                                                                      dtype=torch.float64)
    return history, (lambda w: A @ w - b)


def _stale_update_harness(rank, world_size, learner_fn, seed, t, staleness, lr):
    history, grad_fn = _problem(seed, t)
    expected = stale_update(history, grad_fn, lr, staleness)
    got = learner_fn([w.clone() for w in history], grad_fn, lr, staleness)
    return expected, got


def _mistakes():
    """Typical mistakes, each with what it means; the check names the one an answer matches."""
    return {
        tr("the gradient is taken at the newest weights: that is synchronous SGD, staleness 0"):
            lambda h, f, lr, s: h[-1] - lr * f(h[-1]),
        tr("the stale gradient is applied to the stale weights; the server applies it to its "
           "newest weights, the ones other workers have updated since"):
            lambda h, f, lr, s: h[max(0, len(h) - 1 - s)] - lr * f(h[max(0, len(h) - 1 - s)]),
        tr("off by one: history[-staleness] is w_(t - staleness + 1); the weights staleness "
           "updates before the newest are history[-1 - staleness]"):
            lambda h, f, lr, s: h[-1] - lr * f(h[max(0, len(h) - s)] if s else h[-1]),
        tr("while fewer than staleness updates exist a negative index wraps around to recent "
           "weights; the gradient must come from w_0 then"):
            lambda h, f, lr, s: h[-1] - lr * f(h[len(h) - 1 - s]),
    }


def _matches(learner_fn, mistake, case):
    """True or False: the answer equals the mistake on this case; None: the answer raised."""
    history, grad_fn = _problem(case["seed"], case["t"])
    args = (case["lr"], case["staleness"])
    try:
        got = learner_fn([w.clone() for w in history], grad_fn, *args)
    except Exception:   # e.g. an IndexError on a short history: judged on the other cases
        return None
    wrong = mistake(history, grad_fn, *args)
    return isinstance(got, torch.Tensor) and got.shape == wrong.shape and torch.allclose(got, wrong)


def _diagnose(learner_fn, cases):
    """The mistake the answer makes on every case it answers (run here, in one process: the
    function is pure)."""
    for meaning, mistake in _mistakes().items():
        verdicts = [_matches(learner_fn, mistake, case) for case in cases]
        if True in verdicts and False not in verdicts:
            return meaning
    return None


def check_stale_update(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(history, grad_fn, lr, staleness)`` -> the next weights, for
    staleness 0 to 4, histories shorter and longer than the staleness."""
    cases = [dict(world_size=1, seed=s, t=t, staleness=k, lr=0.1)
             for s, (t, k) in enumerate([(4, 0), (5, 1), (6, 3), (7, 2), (2, 4), (0, 1)], 11)]
    result = run_check("stale_update", learner_fn, _stale_update_harness, cases,
                       timeout=timeout)
    if result.passed or result.case is None:   # passed, or a stub: nothing to diagnose
        return result
    meaning = _diagnose(learner_fn, cases)
    if meaning is None:
        return result
    return type(result)(False, f"{result.message}; {meaning}", result.case)
