"""Exercise checkers of lab 06b: Megatron's f and g operators as autograd Functions (on real
ranks), and the token count at which a layer's tensor-parallel bytes equal its data-parallel
bytes (no ranks needed). Registered in ``labutils.course``; notebooks call them as
``lu.check_<name>``."""
import numbers

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labutils.core.i18n import tr
from labutils.exercises.base import (
    CheckResult,
    call_learner,
    make_cases,
    require_function,
    run_check,
)
from labutils.parallel.tensor_parallel import MLP, TPLayout, shard

# ---- the reference (lu.show_solution("f_and_g")) -----------------------------------------

def f_and_g():
    """Megatron's f and g (arXiv:1909.08053, figure 3) on the default process group."""

    class F(torch.autograd.Function):
        """Before a column-parallel layer: identity forward, all-reduce (sum) backward."""

        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()          # all_reduce works in place: keep autograd's tensor
            dist.all_reduce(grad)        # each rank holds the part from its slice of W
            return grad

    class G(torch.autograd.Function):
        """After a row-parallel layer: all-reduce (sum) forward, identity backward."""

        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            dist.all_reduce(x)           # the partial outputs add up to the layer's output
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad                  # d(sum)/d(each term) = 1

    return F, G


# ---- the check --------------------------------------------------------------------------

def _per_rank(seed, rank, shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed * 100 + rank))


def _probe(op, x, upstream):
    """``op.apply(x)`` and the gradient that reaches ``x`` from ``upstream``."""
    x = x.clone().requires_grad_()
    y = op.apply(x)
    y.backward(upstream.clone())       # a clone: an in-place all-reduce must not change ours
    return y.detach(), x.grad


def _which(got, own, total, world_size):
    """Name what ``got`` is: this rank's own tensor, the sum over ranks, their mean, or the sum
    summed again over ranks (all-reduced twice); "other" for anything else."""
    for name, value in (("own", own), ("sum", total), ("mean", total / world_size),
                        ("twice", total * world_size)):
        if got is not None and got.shape == value.shape and torch.allclose(got, value,
                                                                            atol=1e-5):
            return name
    return "other"


def _diagnosis(f, g):
    """(f forward, f backward), (g forward, g backward) as ``_which`` names them -> what is
    wrong, in words short enough for a check's message, or None."""
    if f[0] in ("sum", "twice") and g[0] == "own":
        return tr("f and g swapped: f sums in backward, g in forward")
    messages = {
        ("g", 0, "own"): tr("g's forward does not all-reduce the partial outputs"),
        ("g", 0, "mean"): tr("g's forward averages; the partial outputs must be summed"),
        ("g", 0, "twice"): tr("g's forward all-reduces twice; once is the sum"),
        ("g", 1, "sum"): tr("g's backward all-reduces; it must be the identity"),
        ("g", 1, "twice"): tr("g's backward all-reduces; it must be the identity"),
        ("f", 0, "sum"): tr("f's forward all-reduces; it must be the identity"),
        ("f", 0, "twice"): tr("f's forward all-reduces; it must be the identity"),
        ("f", 1, "own"): tr("f's backward does not all-reduce the input gradient"),
        ("f", 1, "mean"): tr("f's backward averages; the gradient parts must be summed"),
        ("f", 1, "twice"): tr("f's backward all-reduces twice; once is the sum"),
    }
    for key in (("g", 0, g[0]), ("g", 1, g[1]), ("f", 0, f[0]), ("f", 1, f[1])):
        if key in messages:
            return messages[key]
    return None


def _f_and_g_harness(rank, world_size, learner_fn, seed, rows, hidden):
    f_op, g_op = learner_fn()
    shape, p = (rows, hidden), world_size
    parts = [_per_rank(seed, r, shape) for r in range(p)]   # differ per rank
    same = _per_rank(seed, 99, shape)                        # equal on every rank
    total = sum(parts)
    # f: a replicated input forward, per-rank gradient parts backward; g: the reverse
    f_fwd, f_bwd = _probe(f_op, same, parts[rank])
    g_fwd, g_bwd = _probe(g_op, parts[rank], same)
    f_seen = (_which(f_fwd, same, same * p, p), _which(f_bwd, parts[rank], total, p))
    g_seen = (_which(g_fwd, parts[rank], total, p), _which(g_bwd, same, same * p, p))
    problem = _diagnosis(f_seen, g_seen)
    if problem is not None:
        return {tr("f and g"): tr("right")}, {tr("f and g"): problem}
    if "other" in f_seen + g_seen:          # none of the usual mistakes: the first difference
        keys = (tr("f forward"), tr("f backward"), tr("g forward"), tr("g backward"))
        return (dict(zip(keys, (same, total, total, same))),
                dict(zip(keys, (f_fwd, f_bwd, g_fwd, g_bwd))))
    # both look right: use them in a parallel MLP, compare with one process
    torch.manual_seed(seed)
    mlp, x, dy = MLP(hidden), torch.randn(rows, hidden), torch.randn(rows, hidden)
    x_ref = x.clone().requires_grad_()
    (mlp(x_ref) * dy).sum().backward()
    layout = TPLayout(rank, world_size)
    w1, b1 = (shard(t, layout, 0).requires_grad_() for t in (mlp.fc1.weight, mlp.fc1.bias))
    w2 = shard(mlp.fc2.weight, layout, 1).requires_grad_()
    x_par = x.clone().requires_grad_()
    y = g_op.apply(F.linear(F.gelu(F.linear(f_op.apply(x_par), w1, b1)), w2)) + mlp.fc2.bias
    (y * dy).sum().backward()
    keys = (tr("MLP output"), tr("MLP input grad"), tr("fc1.weight grad"), tr("fc2.weight grad"))
    expected = (mlp(x).detach(), x_ref.grad, shard(mlp.fc1.weight.grad, layout, 0),
                shard(mlp.fc2.weight.grad, layout, 1))
    return dict(zip(keys, expected)), dict(zip(keys, (y.detach(), x_par.grad, w1.grad, w2.grad)))


def check_f_and_g(f, g, *, timeout=30.0):
    """Check two ``torch.autograd.Function`` classes used as ``f.apply(x)`` and ``g.apply(x)``
    on the default group: f is the identity forward and all-reduces (sums) the gradient
    backward; g all-reduces (sums) forward and is the identity backward. Each is probed alone
    on 2 real ranks, then both are used in a tensor-parallel MLP against one process."""
    for name, op in (("f", f), ("g", g)):
        if not (isinstance(op, type) and issubclass(op, torch.autograd.Function)):
            raise TypeError(tr("check_f_and_g needs two torch.autograd.Function classes, "
                               "lu.check_f_and_g(MyF, MyG); {name} is {op!r}", name=name, op=op))
    cases = make_cases(world_sizes=(2,), per_world_size=2, seed=6, rows=[3, 5], hidden=[4, 8])
    return run_check("f_and_g", lambda: (f, g), _f_and_g_harness, cases, timeout=timeout)


# ---- the crossover of a layer's bytes (lu.show_solution("crossover_tokens")) ----------------

def crossover_tokens(hidden, tp_size):
    """Tokens B*T per step at which one transformer layer's tensor-parallel all-reduces are
    handed as many bytes as its data-parallel gradient all-reduce (fp32, MLP width 4H)."""
    tp_bytes_per_token = 4 * hidden * 4            # g, g forward, f, f backward: H floats each
    dp_bytes = (12 * hidden ** 2 + 9 * hidden) * 4  # every parameter's gradient, once per step
    # Both sides are all-reduces of a payload that does not shrink with p: a ring moves
    # 2(p-1)/p of either per rank, so tp_size cancels.
    return dp_bytes / tp_bytes_per_token


def _crossover_mistakes():
    """Typical wrong answers as functions of (hidden, expected), each with what is wrong."""
    return (
        (lambda h, e: 2 * e,
         tr("That is twice the crossover: it counts half of tensor parallelism's bytes per "
            "token. A layer all-reduces its (B*T, H) activation four times per step, g twice in "
            "forward and f twice in backward; counting only the forward ones (or only one "
            "block's two, or data parallelism's bytes both ways and tensor parallelism's one "
            "way) doubles the answer.")),
        (lambda h, e: e / 2,
         tr("That is half the crossover: tensor parallelism's bytes per token are counted "
            "twice over. A layer has four all-reduces per step (two forward, two backward), not "
            "eight; if you counted a ring's bytes both sent and received, count data "
            "parallelism's gradient all-reduce the same way.")),
        (lambda h, e: 4 * e,
         tr("That is 4 times the crossover: one side is in bytes and the other in elements. "
            "Count both in fp32 bytes (4 per element), or both in elements.")),
        (lambda h, e: e / 4,
         tr("That is a quarter of the crossover: one side is in bytes and the other in "
            "elements. Count both in fp32 bytes (4 per element), or both in elements.")),
        (lambda h, e: 4 * h + 2.5,
         tr("That is the MLP block's crossover (one column and row pair, 8H^2 + 5H "
            "parameters). A layer is attention and the MLP: add attention's parameters and "
            "its two all-reduces.")),
        (lambda h, e: 2 * h + 2,
         tr("That is the attention block's crossover (4H^2 + 4H parameters). A layer is "
            "attention and the MLP: add the MLP's parameters and its two all-reduces.")),
        (lambda h, e: 3 * h,
         tr("That leaves out the biases: data parallelism all-reduces their gradients too "
            "(both blocks' linear layers have biases).")),
    )


_CROSSOVER_CASES = ((256, 2), (64, 2), (1000, 2), (16, 2))


def _where(number, h, p):
    return tr("[wrong] {name}: case {number} of {total} ({case})", name="crossover_tokens",
              number=number, total=len(_CROSSOVER_CASES), case=f"hidden={h}, tp_size={p}")


def _ask_tokens(learner_fn, where, h, p):
    """(the learner's answer for hidden ``h`` and ``tp_size`` ``p`` as a float, None), or
    (None, the failed CheckResult) when it raised or returned no number."""
    got, failed = call_learner("crossover_tokens", learner_fn, where, h, p)
    if failed:
        return None, failed
    if not isinstance(got, numbers.Real) or isinstance(got, bool):
        return None, CheckResult(False, tr("{where}: expected a number of tokens, got {type} "
                                           "{got!r}.", where=where, type=type(got).__name__,
                                           got=got))
    return float(got), None


def check_crossover_tokens(learner_fn):
    """Check ``learner_fn(hidden, tp_size)``: the tokens B*T per step at which one transformer
    layer's tensor-parallel all-reduce bytes equal its data-parallel gradient bytes, for several
    hidden sizes; first, that the answer does not change with ``tp_size`` (no processes)."""
    require_function("crossover_tokens", learner_fn)
    seen = {}
    for p in (2, 4, 8):                      # the answer must not depend on p
        got, failed = _ask_tokens(learner_fn, _where(1, 256, p), 256, p)
        if failed:
            return failed
        seen[p] = got
    if max(seen.values()) - min(seen.values()) > 1e-9 * max(1.0, abs(seen[2])):
        return CheckResult(False, tr(
            "[wrong] crossover_tokens: your answer changes with the tensor-parallel size ({a} at "
            "tp_size=2, {b} at tp_size=8); it should not. Both sides are all-reduces of a "
            "payload that does not shrink with p (the whole activation in tensor parallelism, "
            "the whole gradient in data parallelism), and a ring moves 2(p-1)/p of either per "
            "rank, so that factor, applied to both sides or to neither, cancels.",
            a=_number(seen[2]), b=_number(seen[8])), {"hidden": 256})
    for number, (h, p) in enumerate(_CROSSOVER_CASES, 1):
        where = _where(number, h, p)
        got, failed = _ask_tokens(learner_fn, where, h, p)
        if failed:
            return failed
        expected = crossover_tokens(h, p)
        if abs(got - expected) <= 1e-9 * expected:
            continue
        why = next((text for wrong, text in _crossover_mistakes()
                    if abs(got - wrong(h, expected)) <= 1e-9 * expected), None)
        if why is None and float(got).is_integer() and abs(got - expected) < 1:
            why = tr("That is a whole number next to the crossover: return the exact point where "
                     "the two byte counts are equal; it need not be a whole number of tokens.")
        if why is None:
            why = tr("Count, per step, the bytes a layer hands to tensor parallelism's "
                     "all-reduces for each token, and the bytes of every gradient data "
                     "parallelism all-reduces; the crossover is their quotient.")
        return CheckResult(False, tr("{where}: expected {e}, got {g}. {why}", where=where,
                                     e=_number(expected), g=_number(got), why=why),
                           {"hidden": h, "tp_size": p})
    return CheckResult(True, tr("[ok] {name}: {total} cases passed", name="crossover_tokens",
                                total=len(_CROSSOVER_CASES)))


def _number(x):
    return f"{float(x):.6g}"
