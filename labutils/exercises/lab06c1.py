"""Exercise checker of lab 06c1: one ZeRO-1 optimiser step. Registered in ``labutils.course``;
notebooks call it as ``lu.check_zero1_step``. A wrong answer's message names the typical
mistake when it is one: the sum instead of the mean, no all-gather, a collective whose input
and output overlap, the gradient reduce-scattered into the weights."""
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from labutils.core.i18n import tr
from labutils.core.launcher import launch
from labutils.exercises.base import make_cases, run_check
from labutils.parallel.sharding import padded, zero1_step  # noqa: F401 (the reference)

STEPS = 2


def _problem(seed, numel, world_size):
    """The start weights and every rank's gradient of every step, padded with zeros."""
    torch.manual_seed(seed)
    n = padded(numel, world_size)
    pad = lambda t: torch.cat([t, torch.zeros(n - numel)])  # noqa: E731 (zeros, as flat_padded)
    start = pad(torch.randn(numel))
    grads = [[pad(torch.randn(numel)) for _ in range(world_size)] for _ in range(STEPS)]
    return start, grads


def _one_process(start, grads, divide):
    """SGD with momentum on one process; the gradient is the ranks' sum / ``divide``."""
    full = nn.Parameter(start.clone())
    opt = torch.optim.SGD([full], lr=0.1, momentum=0.9)
    for step_grads in grads:
        full.grad = sum(step_grads) / divide
        opt.step()
    return full.detach()


def _regions(t):
    start = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
    return t.untyped_storage().data_ptr(), start, start + t.numel() * t.element_size()


class _BufferGuard(TorchDispatchMode):
    """Refuses, with the reason, a reduce-scatter or all-gather whose buffers overlap other than
    in place (NCCL's in-place layout: the input is this rank's slice of an all-gather's output,
    the output this rank's slice of a reduce-scatter's input; gloo accepts it too), and a
    reduce-scatter whose output is part of the weights ``flat``."""

    def __init__(self, flat, rank, world_size):
        super().__init__()
        self.flat, self.rank, self.world_size = flat, rank, world_size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = str(func.overloadpacket).split(".")[-1]
        if op in ("_allgather_base_", "_reduce_scatter_base_"):
            out, inp = args[0], args[1]
            gather = op == "_allgather_base_"
            whole, part = (out, inp) if gather else (inp, out)
            w_storage, w_start, w_end = _regions(whole)
            p_storage, p_start, p_end = _regions(part)
            slice_bytes = part.numel() * part.element_size()
            in_place = (w_storage == p_storage and part.is_contiguous() and whole.is_contiguous()
                        and p_start == w_start + self.rank * slice_bytes)
            if w_storage == p_storage and p_start < w_end and w_start < p_end and not in_place:
                raise ValueError(tr(
                    "the input and the output of your {collective} overlap in memory, and not "
                    "in the one in-place layout a collective allows (the input exactly this "
                    "rank's slice of the full tensor), so ranks may read values that are "
                    "already overwritten; give it a separate buffer or a copy "
                    "(shard.detach().clone())",
                    collective="all-gather" if gather else "reduce-scatter"))
            if not gather and _regions(self.flat)[0] == _regions(out)[0]:
                raise ValueError(tr(
                    "your reduce-scatter writes its output into the weights (shard is a view "
                    "of flat): the summed gradient replaces the weights before the optimizer "
                    "sees it; reduce-scatter into a new tensor (torch.empty_like(shard)) and "
                    "set it as shard.grad"))
        return func(*args, **(kwargs or {}))


def _zero1_harness(rank, world_size, learner_fn, seed, numel):
    start, grads = _problem(seed, numel, world_size)
    expected = _one_process(start, grads, divide=world_size)  # the mean: data parallelism
    return expected, _learner_flat(rank, world_size, learner_fn, start, grads)


def _learner_flat(rank, world_size, learner_fn, start, grads):
    flat = start.clone()
    shard = nn.Parameter(flat.chunk(world_size)[rank])  # a view: updating it updates flat
    optimizer = torch.optim.SGD([shard], lr=0.1, momentum=0.9)
    for step_grads in grads:
        with _BufferGuard(flat, rank, world_size):
            learner_fn(rank, world_size, flat, step_grads[rank].clone(), shard, optimizer)
    return flat


def _flats_harness(rank, world_size, learner_fn, seed, numel):
    start, grads = _problem(seed, numel, world_size)
    return _learner_flat(rank, world_size, learner_fn, start, grads)


def _close(a, b):
    return torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def diagnose(flats, start, grads):
    """The typical mistake that explains every rank's final ``flats``, in words; None when
    none does. Pure: the ranks' results and the problem in, a sentence out."""
    world_size = len(flats)
    mean = _one_process(start, grads, divide=world_size)
    if all(_close(f, _one_process(start, grads, divide=1)) for f in flats):
        return tr("every rank's weights moved as if the gradient were the sum over the ranks, "
                  "not the mean: reduce-scatter sums, and gloo has no average, so divide the "
                  "gradient shard by world_size")
    own = [f.chunk(world_size)[r] for r, f in enumerate(flats)]
    if (all(_close(o, m) for o, m in zip(own, mean.chunk(world_size)))
            and all(_close(f.chunk(world_size)[k], start.chunk(world_size)[k])
                    for r, f in enumerate(flats) for k in range(world_size) if k != r)):
        return tr("each rank updated its own slice of the weights and no other: the updated "
                  "slices never reached the other ranks; all-gather every rank's shard into "
                  "flat after optimizer.step()")
    return None


def check_zero1_step(learner_fn, *, timeout=90.0):
    """Check ``learner_fn(rank, world_size, flat, grad, shard, optimizer)`` over two steps of
    SGD with momentum: every rank's ``flat`` equals single-process training on the mean
    gradient. No numel divides by the world size: ``flat`` ends in zero padding. A wrong answer
    is rerun once to name its mistake when it is a typical one."""
    cases = make_cases(world_sizes=(2, 4), per_world_size=1, seed=7, numel=[9, 13, 21])
    result = run_check("zero1_step", learner_fn, _zero1_harness, cases, timeout=timeout)
    if result.passed or result.case is None:  # passed, or a stub: nothing to diagnose
        return result
    case = result.case
    try:
        flats = launch(_flats_harness, learner_fn, case["seed"], case["numel"],
                       world_size=case["world_size"], timeout=timeout, threads_per_rank=1,
                       warn_oversubscription=False)
    except Exception:  # noqa: BLE001 (a crash or a deadlock is already named by the check)
        return result
    start, grads = _problem(case["seed"], case["numel"], case["world_size"])
    meaning = diagnose(flats, start, grads)
    if meaning is None:
        return result
    return type(result)(False, f"{result.message}; {meaning}", case)
