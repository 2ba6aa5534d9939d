"""Exercise checkers of lab 02: a hand-written autograd Function (``Square``); counting the
nodes of an autograd graph through ``grad_fn.next_functions``. Both run in this process (no
ranks needed). Registered in ``labutils.course``; notebooks call them as ``lu.check_<name>``."""
import torch

from labutils.exercises.base import FILL_ME_IN, CheckResult

# ---- exercise 2: a custom autograd Function ------------------------------------------------


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
    for wrong, why in ((x * g, "x * grad_output is half of it: d(x**2)/dx = 2x"),
                       (2 * x, "2x alone ignores grad_output: the chain rule multiplies by it"),
                       (x, "x alone: the derivative of x**2 is 2x, times grad_output"),
                       (g, "grad_output alone: multiply by the local derivative 2x"),
                       (2 * g, "2 * grad_output: the local derivative is 2x, not 2")):
        if grad.shape == wrong.shape and torch.allclose(grad, wrong):
            return why
    return "not 2 * x * grad_output"


def check_square(learner_cls):
    """Check ``learner_cls``, a ``torch.autograd.Function`` computing x ** 2: its forward, its
    backward against 2 x times the incoming gradient (a non-uniform one, so a backward that
    forgets ``grad_output`` shows), and ``torch.autograd.gradcheck``."""
    if not (isinstance(learner_cls, type) and issubclass(learner_cls, torch.autograd.Function)):
        raise TypeError("check_square needs your class itself, a subclass of "
                        "torch.autograd.Function, e.g. lu.check_square(Square)")
    cases = ((3,), (2, 4), (5,))
    for number, shape in enumerate(cases, 1):
        where = f"[wrong] square: case {number} of {len(cases)} (x of shape {list(shape)})"
        gen = torch.Generator().manual_seed(number)
        x = torch.randn(shape, dtype=torch.float64, generator=gen).requires_grad_()
        g = torch.rand(shape, dtype=torch.float64, generator=gen) + 0.5   # upstream gradient
        try:
            y = learner_cls.apply(x)
            if not isinstance(y, torch.Tensor) or y.shape != x.shape or \
                    not torch.allclose(y, x.detach() ** 2):
                return CheckResult(False, f"{where}: forward should return x ** 2", {"shape": shape})
            (grad,) = torch.autograd.grad(y, x, g)
        except NotImplementedError:
            return CheckResult(False, f"[to do] square: not implemented yet; {FILL_ME_IN}")
        except Exception as e:  # noqa: BLE001 (report any error as the learner's)
            return CheckResult(False, f"{where}: raised {type(e).__name__}: "
                                      f"{str(e).splitlines()[0][:120]}", {"shape": shape})
        expected = 2 * x.detach() * g
        if grad is None or grad.shape != x.shape:
            return CheckResult(False, f"{where}: backward should return one gradient shaped "
                                      f"like x", {"shape": shape})
        if not torch.allclose(grad, expected):
            why = _square_diagnosis(x.detach(), g, grad)
            return CheckResult(False, f"{where}: wrong gradient: {why}", {"shape": shape})
    if not torch.autograd.gradcheck(learner_cls.apply, (x,), raise_exception=False):
        return CheckResult(False, "[wrong] square: gradcheck disagrees with your backward")
    return CheckResult(True, f"[ok] square: {len(cases)} cases and gradcheck passed")


# ---- exercise 6: the nodes of an autograd graph --------------------------------------------


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
    yield "tanh(a * b) used twice", (h * h + h).sum()
    yield "a and b each used twice", ((a + b) * (a - b) * c).sum()
    s = a.exp()
    yield "a chain that forks and joins", (s.sin() + s.cos() * b).mean()


_COUNT_MISTAKES = (
    (lambda t: _paths(t.grad_fn), "that counts a node once per path to it; a node reached by "
                                  "two paths is one node (keep a set of the nodes seen)"),
    (lambda t: _first_branch(t.grad_fn), "that follows only the first edge of each node; "
                                         "follow every entry of next_functions"),
    (_without_leaves, "the AccumulateGrad nodes (one per leaf that requires grad) are nodes too"),
)


def check_count_graph_nodes(learner_fn):
    """Check ``learner_fn(t)``: the number of distinct autograd nodes reachable from
    ``t.grad_fn``, on graphs with shared subexpressions and leaves without gradients."""
    if not callable(learner_fn):
        raise TypeError("check_count_graph_nodes needs your function itself, e.g. "
                        "lu.check_count_graph_nodes(count_graph_nodes)")
    graphs = list(_graphs())
    for number, (name, t) in enumerate(graphs, 1):
        where = f"[wrong] count_graph_nodes: case {number} of {len(graphs)} ({name})"
        try:
            got = learner_fn(t)
        except NotImplementedError:
            return CheckResult(False, f"[to do] count_graph_nodes: not implemented yet; "
                                      f"{FILL_ME_IN}")
        except Exception as e:  # noqa: BLE001 (report any error as the learner's)
            return CheckResult(False, f"{where}: raised {type(e).__name__}: {e}")
        expected = count_graph_nodes(t)
        if got == expected and isinstance(got, int):
            continue
        why = next((text for wrong, text in _COUNT_MISTAKES if wrong(t) == got), "")
        return CheckResult(False, f"{where}: expected {expected}, got {got!r}"
                                  + (f": {why}" if why else ""), {"graph": name})
    return CheckResult(True, f"[ok] count_graph_nodes: {len(graphs)} graphs passed")
