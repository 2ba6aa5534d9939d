"""Exercise checkers of lab 02: a hand-written autograd Function (``Square``); counting the
nodes of an autograd graph through ``grad_fn.next_functions``. Both run in this process (no
ranks needed). Registered in ``labutils.course``; notebooks call them as ``lu.check_<name>``."""
import torch

from labutils.core.i18n import tr
from labutils.exercises.base import CheckResult, not_implemented

# ---- exercise 1: a custom autograd Function ------------------------------------------------


class Square(torch.autograd.Function):
    """Reference: y = x ** 2 with its backward by hand, dy/dx = 2x, times the incoming gradient."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 2

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return 2 * x * grad_output


square = Square  # the reference under the exercise's name, for lu.show_solution("square")


def _square_diagnosis(x, g, grad):
    """What a wrong gradient is, in words (the typical slips of a first backward)."""
    for wrong, why in ((x * g, tr("x * grad_output is half of it: d(x**2)/dx = 2x")),
                       (2 * x, tr("2x alone ignores grad_output: the chain rule multiplies by "
                                  "it")),
                       (x, tr("x alone: the derivative of x**2 is 2x, times grad_output")),
                       (g, tr("grad_output alone: multiply by the local derivative 2x")),
                       (2 * g, tr("2 * grad_output: the local derivative is 2x, not 2"))):
        if grad.shape == wrong.shape and torch.allclose(grad, wrong):
            return why
    return tr("not 2 * x * grad_output")


def check_square(learner_cls):
    """Check ``learner_cls``, a ``torch.autograd.Function`` computing x ** 2: its forward, its
    backward against 2 x times the incoming gradient (a non-uniform one, so a backward that
    forgets ``grad_output`` shows), and ``torch.autograd.gradcheck``."""
    if not (isinstance(learner_cls, type) and issubclass(learner_cls, torch.autograd.Function)):
        raise TypeError(tr("check_square needs your class itself, a subclass of "
                           "torch.autograd.Function, e.g. lu.check_square(Square)"))
    cases = ((3,), (2, 4), (5,))
    for number, shape in enumerate(cases, 1):
        where = tr("[wrong] {name}: case {number} of {total} ({case})", name="square",
                   number=number, total=len(cases),
                   case=tr("x of shape {shape}", shape=list(shape)))
        gen = torch.Generator().manual_seed(number)
        x = torch.randn(shape, dtype=torch.float64, generator=gen).requires_grad_()
        g = torch.rand(shape, dtype=torch.float64, generator=gen) + 0.5   # upstream gradient
        try:
            y = learner_cls.apply(x)
            if not isinstance(y, torch.Tensor) or y.shape != x.shape or \
                    not torch.allclose(y, x.detach() ** 2):
                return CheckResult(False, tr("{where}: forward should return x ** 2",
                                             where=where), {"shape": shape})
            (grad,) = torch.autograd.grad(y, x, g)
        except NotImplementedError:
            return CheckResult(False, not_implemented("square"))
        except Exception as e:  # noqa: BLE001 (report any error as the learner's)
            return CheckResult(False, tr("{where}: raised {error}: {message}", where=where,
                                         error=type(e).__name__,
                                         message=str(e).splitlines()[0][:120]), {"shape": shape})
        expected = 2 * x.detach() * g
        if grad is None or grad.shape != x.shape:
            return CheckResult(False, tr("{where}: backward should return one gradient shaped "
                                         "like x", where=where), {"shape": shape})
        if not torch.allclose(grad, expected):
            why = _square_diagnosis(x.detach(), g, grad)
            return CheckResult(False, tr("{where}: wrong gradient: {why}", where=where, why=why),
                               {"shape": shape})
    if not torch.autograd.gradcheck(learner_cls.apply, (x,), raise_exception=False):
        return CheckResult(False, tr("[wrong] {name}: gradcheck disagrees with your backward",
                                     name="square"))
    return CheckResult(True, tr("[ok] {name}: {n} cases and gradcheck passed", name="square",
                                n=len(cases)))


# ---- exercise 2: the nodes of an autograd graph --------------------------------------------


def count_graph_nodes(t):
    """Reference: the number of distinct nodes of the graph that ``t.grad_fn`` starts,
    following every edge of ``next_functions`` (AccumulateGrad leaves included; a node reached
    by two paths counts once)."""
    seen, todo = set(), [t.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(f for f, _ in node.next_functions)
    return len(seen)


def _paths(node):
    """Wrong on purpose: a tree walk that counts a node once per path to it."""
    return 0 if node is None else 1 + sum(_paths(f) for f, _ in node.next_functions)


def _first_branch(node):
    """Wrong on purpose: follow only the first non-None edge (the notebook's chain walk)."""
    n = 0
    while node is not None:
        n += 1
        node = next((f for f, _ in node.next_functions if f is not None), None)
    return n


def _without_leaves(t):
    """Wrong on purpose: distinct nodes, AccumulateGrad left out."""
    seen, todo = set(), [t.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(f for f, _ in node.next_functions)
    return sum(type(n).__name__ != "AccumulateGrad" for n in seen)


def _graphs():
    """Graphs where the typical wrong counts all differ from the right one."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(3, generator=gen, requires_grad=True) for _ in range(2))
    c = torch.randn(3, generator=gen)                       # no gradient: no leaf node
    h = torch.tanh(a * b)
    yield tr("tanh(a * b) used twice"), (h * h + h).sum()
    yield tr("a and b each used twice"), ((a + b) * (a - b) * c).sum()
    s = a.exp()
    yield tr("a chain that forks and joins"), (s.sin() + s.cos() * b).mean()


def _count_mistakes():
    return (
        (lambda t: _paths(t.grad_fn), tr("that counts a node once per path to it; a node "
                                         "reached by two paths is one node (keep a set of the "
                                         "nodes seen)")),
        (lambda t: _first_branch(t.grad_fn), tr("that follows only the first edge of each "
                                                "node; follow every entry of next_functions")),
        (_without_leaves, tr("the AccumulateGrad nodes (one per leaf that requires grad) are "
                             "nodes too")),
    )


def check_count_graph_nodes(learner_fn):
    """Check ``learner_fn(t)``: the number of distinct autograd nodes reachable from
    ``t.grad_fn``, on graphs with shared subexpressions and leaves without gradients."""
    if not callable(learner_fn):
        raise TypeError(tr("check_count_graph_nodes needs your function itself, e.g. "
                           "lu.check_count_graph_nodes(count_graph_nodes)"))
    graphs = list(_graphs())
    for number, (name, t) in enumerate(graphs, 1):
        where = tr("[wrong] {name}: case {number} of {total} ({case})",
                   name="count_graph_nodes", number=number, total=len(graphs), case=name)
        try:
            got = learner_fn(t)
        except NotImplementedError:
            return CheckResult(False, not_implemented("count_graph_nodes"))
        except Exception as e:  # noqa: BLE001 (report any error as the learner's)
            return CheckResult(False, tr("{where}: raised {error}: {message}", where=where,
                                         error=type(e).__name__, message=e))
        expected = count_graph_nodes(t)
        if got == expected and isinstance(got, int):
            continue
        why = next((text for wrong, text in _count_mistakes() if wrong(t) == got), "")
        return CheckResult(False, f"{where}: " + tr("expected {e}, got {g}", e=expected,
                                                    g=repr(got))
                                  + (f": {why}" if why else ""), {"graph": name})
    return CheckResult(True, tr("[ok] {name}: {n} graphs passed", name="count_graph_nodes",
                                n=len(graphs)))
