"""Exercise checkers of lab 06d: which rank each slot of a mixture-of-experts layer is sent to;
merging two key blocks' attention with the online softmax (ring attention). Registered in
``labutils.course``; notebooks call them as ``lu.check_<name>``. Every sentence a student reads
goes through ``tr`` (its Chinese: ``exercises/locale/zh.po``)."""
import random

import torch

from labutils.core.i18n import tr
from labutils.exercises.base import (
    CheckResult,
    first_difference,
    not_implemented,
    run_check,
)
from labutils.parallel.moe_router import dispatch_indices
from labutils.parallel.online_softmax import (  # noqa: F401 (the reference)
    block_attention,
    causal_mask,
    merge_attention_blocks,
)

# ---- dispatch_indices -------------------------------------------------------------------

_DISPATCH_CASES = (   # E/N >= 2 in every case, so per expert and per rank, // and % all differ
    {"world_size": 2, "num_experts": 4, "tokens": 9, "top_k": 2, "seed": 11},
    {"world_size": 3, "num_experts": 6, "tokens": 7, "top_k": 2, "seed": 12},
    {"world_size": 4, "num_experts": 8, "tokens": 10, "top_k": 2, "seed": 13},
    {"world_size": 2, "num_experts": 8, "tokens": 6, "top_k": 1, "seed": 14},
    # the last rank's experts get no slot: a bincount without minlength returns N-1 counts
    {"world_size": 3, "num_experts": 6, "tokens": 5, "top_k": 2, "seed": 15, "empty_rank": 2},
)


def _decisions(seed, rank, tokens, num_experts, top_k, empty_rank=None, world_size=1):
    """A router's choices for one rank: ``[tokens, top_k]`` distinct experts per token, none of
    them an expert of ``empty_rank`` when it is given."""
    rng = random.Random(seed * 101 + rank)
    per_rank = num_experts // world_size
    experts = [e for e in range(num_experts) if empty_rank is None or e // per_rank != empty_rank]
    rows = [rng.sample(experts, top_k) for _ in range(tokens)]
    return torch.tensor(rows, dtype=torch.long)


def _as_long(x):
    try:
        t = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError):
        return None
    return t.long() if t.dim() == 1 and not t.is_floating_point() else None


def _diagnosis(expert, num_experts, world_size, order, counts):
    """(what, what is wrong) for ``(order, counts)``, or None (then compare the values). Short:
    a check's message shows at most 60 characters of it."""
    flat = expert.flatten()
    slots, per_rank, tokens = flat.numel(), num_experts // world_size, expert.shape[0]
    if counts is None or order is None:
        return tr("answer"), tr("order, send_counts: 1-D integer tensors or lists")
    if len(counts) < world_size:
        return "send_counts", tr("send_counts has length {n} < N: use minlength=N", n=len(counts))
    if len(counts) == num_experts and num_experts != world_size:
        return "send_counts", tr("one per expert ({num_experts}); count per rank ({world_size})",
                                 num_experts=num_experts, world_size=world_size)
    if len(order) == tokens < slots or int(counts.sum()) == tokens < slots:
        return "order", tr("only {tokens} of {slots} slots: flatten the [T, k] choices",
                           tokens=tokens, slots=slots)
    if len(counts) == world_size and counts.tolist() == torch.bincount(
            flat % world_size, minlength=world_size).tolist() != torch.bincount(
            flat // per_rank, minlength=world_size).tolist():
        return "send_counts", tr("e % {world_size}: experts are contiguous, owner e // {per_rank}",
                                 world_size=world_size, per_rank=per_rank)
    if sorted(order.tolist()) != list(range(slots)):
        return "order", tr("must list each of the {slots} slots exactly once", slots=slots)
    got = flat[order]
    if (got // per_rank).diff().lt(0).any():
        return "order", tr("not grouped by destination rank (rank 0 first)")
    if got.diff().lt(0).any():
        return "order", tr("within a rank, order the slots by expert")
    if (order.diff()[got.diff() == 0] < 0).any():
        return "order", tr("within an expert, keep slot order t*k + j (stable sort)")
    return None


def _dispatch_harness(rank, world_size, learner_fn, seed, num_experts, tokens, top_k,
                      empty_rank=None):
    expert = _decisions(seed, rank, tokens, num_experts, top_k, empty_rank, world_size)
    want_order, want_counts = dispatch_indices(expert, num_experts, world_size)
    answer = learner_fn(expert.clone(), num_experts, world_size)
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2):
        return ({tr("answer"): tr("right")},
                {tr("answer"): tr("{type}, not a pair", type=type(answer).__name__)})
    order, counts = (_as_long(a) for a in answer)
    problem = _diagnosis(expert, num_experts, world_size, order, counts)
    if problem is not None:     # order and send_counts are the answer's names: code, not words
        return {problem[0]: tr("right")}, {problem[0]: problem[1]}
    return ({"order": want_order, "send_counts": want_counts},
            {"order": order, "send_counts": counts})


def check_dispatch_indices(learner_fn, *, timeout=30.0):
    """Check ``learner_fn(expert, num_experts, world_size) -> (order, send_counts)`` on real
    ranks: each rank gets its own router decisions (``expert``, ``[T, k]``) and N is the launch's
    world size. The order the reference accepts: slots ``t*k + j`` sorted by expert, ties in slot
    order (stable), which groups them by destination rank; ``send_counts[r]``: slots for rank r."""
    return run_check("dispatch_indices", learner_fn, _dispatch_harness,
                     [dict(case) for case in _DISPATCH_CASES], timeout=timeout, atol=0, rtol=0)


# ---- merge_attention_blocks (ring attention) ---------------------------------------------
# The reference is labutils.parallel.online_softmax.merge_attention_blocks (imported above).

_MERGE_CASES = (   # (what the case is, seed); each one query block over two key blocks
    ("ordinary logits", 21),
    ("large logits, lse in the thousands", 22),
    ("block a fully masked, lse_a = -inf", 23),
    ("block b fully masked, lse_b = -inf", 24),
)


def _merge_blocks(kind, seed):
    """(out_a, lse_a, out_b, lse_b) of 6 queries over two blocks of 6 keys (float64), and the
    truth: attention over all 12 keys at once."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g, dtype=torch.float64) for n in (6, 12, 12))
    if kind.startswith("large"):    # scores of +-thousands: exp(lse) overflows even float64
        q, k = q * 40, k * 40
    q_pos = torch.arange(6, 12)     # queries at positions 6..11
    k_pos = {"block a fully masked, lse_a = -inf": torch.cat([torch.arange(12, 18),
                                                             torch.arange(0, 6)]),
             "block b fully masked, lse_b = -inf": torch.cat([torch.arange(0, 6),
                                                             torch.arange(12, 18)])}.get(
        kind, torch.arange(0, 12))  # a future block: every query of it is masked
    mask = causal_mask(q_pos, k_pos)
    a, b = slice(0, 6), slice(6, 12)
    out_a, lse_a = block_attention(q, k[..., a, :], v[..., a, :], mask[:, a])
    out_b, lse_b = block_attention(q, k[..., b, :], v[..., b, :], mask[:, b])
    return (out_a, lse_a, out_b, lse_b), block_attention(q, k, v, mask)


def _case_words(kind):
    """A case's description in the notebook's language (``kind`` stays the English key)."""
    return {"ordinary logits": tr("ordinary logits"),
            "large logits, lse in the thousands": tr("large logits, lse in the thousands"),
            "block a fully masked, lse_a = -inf": tr("block a fully masked, lse_a = -inf"),
            "block b fully masked, lse_b = -inf": tr("block b fully masked, lse_b = -inf")}[kind]


def _wrong_merges(out_a, lse_a, out_b, lse_b):
    """Typical mistakes: (which output, its value, what is wrong with it)."""
    unnormalised = tr("not renormalised: divide by the total weight, i.e. weight each by "
                      "exp(lse_block - lse)")
    logaddexp = tr("lse = log(exp(lse_a) + exp(lse_b)) (torch.logaddexp)")
    m = torch.maximum(lse_a, lse_b)
    lse = torch.logaddexp(lse_a, lse_b)
    w_a, w_b = torch.exp(lse_a - lse)[..., None], torch.exp(lse_b - lse)[..., None]
    u_a, u_b = torch.exp(lse_a - m)[..., None], torch.exp(lse_b - m)[..., None]
    e_a, e_b = torch.exp(lse_a)[..., None], torch.exp(lse_b)[..., None]
    return (
        ("out", (out_a + out_b) / 2,
         tr("weights the blocks equally; weight each by exp(lse_block - lse)")),
        ("out", u_a * out_a + u_b * out_b, unnormalised),
        ("out", e_a * out_a + e_b * out_b, unnormalised),
        ("out", w_b * out_a + w_a * out_b,
         tr("weights swapped: out_a's weight is exp(lse_a - lse)")),
        ("out", out_a, tr("returns out_a: block b's keys count too")),
        ("out", out_b, tr("returns out_b: block a's keys count too")),
        ("lse", lse_a + lse_b, tr("lse_a + lse_b: the blocks' sums of exp add, so {logaddexp}",
                                  logaddexp=logaddexp)),
        ("lse", m, tr("the larger block's lse: add both blocks' sums, {logaddexp}",
                      logaddexp=logaddexp)),
        ("lse", (lse_a + lse_b) / 2, tr("averages the lse: {logaddexp}", logaddexp=logaddexp)),
    )


def _not_finite_why(kind, what):
    if kind.startswith("large"):
        return tr("{what} has inf/NaN with large logits: exp(lse) overflows; subtract the "
                  "maximum first (weight = exp(lse_block - lse) <= 1, lse by torch.logaddexp)",
                  what=what)
    block, other = ("a", "b") if "block a" in kind else ("b", "a")
    return tr("{what} has NaN where block {block} is fully masked (lse_{block} = -inf): its "
              "weight must be 0 and lse = lse_{other}; -inf - (-inf) is NaN, so anchor on the "
              "larger lse (the max)", what=what, block=block, other=other)


def _merge_problem(kind, inputs, expected, got):
    """What is wrong with ``got`` (out, lse) against ``expected``, in words, or None."""
    if not (isinstance(got, (tuple, list)) and len(got) == 2
            and all(isinstance(t, torch.Tensor) for t in got)):
        what = (tr("a tensor of shape {shape}", shape=list(got.shape))
                if isinstance(got, torch.Tensor) else type(got).__name__)
        return tr("expected (out, lse), two tensors; got {what}", what=what)
    for name, want, have in zip(("out", "lse"), expected, got):
        if list(have.shape) != list(want.shape):
            return tr("{name}: shape {got}, expected {want} (the shape of {name}_a)", name=name,
                      got=list(have.shape), want=list(want.shape))
    for name, want, have in zip(("out", "lse"), expected, got):
        if bool(torch.isfinite(want).all()) and not bool(torch.isfinite(have).all()):
            return _not_finite_why(kind, name)
    wrong = _wrong_merges(*inputs)
    for name, want, have in zip(("lse", "out"), expected[::-1], got[::-1]):
        diff = first_difference(want, have.to(want.dtype), atol=1e-6, rtol=1e-6)
        if diff is None:
            continue
        why = next((text for part, value, text in wrong if part == name
                    and torch.allclose(have.to(value.dtype), value, atol=1e-6, rtol=1e-6)),
                   None)
        return tr("{where}: {problem}", where=name, problem=why or diff)
    return None


def check_merge_attention_blocks(learner_fn):
    """Check ``learner_fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``: the attention of a query
    block over two key blocks from each block's output and log-sum-exp equals the attention
    over all their keys at once, with ordinary logits, logits in the thousands and either
    block fully masked (float64; no processes needed)."""
    if not callable(learner_fn):
        raise TypeError(tr("check_merge_attention_blocks needs your function itself, e.g. "
                           "lu.check_merge_attention_blocks(my_merge)"))
    total = len(_MERGE_CASES)
    for number, (kind, seed) in enumerate(_MERGE_CASES, 1):
        inputs, expected = _merge_blocks(kind, seed)
        where = tr("[wrong] {name}: case {number} of {total} ({case})",
                   name="merge_attention_blocks", number=number, total=total,
                   case=_case_words(kind))
        try:
            got = learner_fn(*(t.clone() for t in inputs))
        except NotImplementedError:
            return CheckResult(False, not_implemented("merge_attention_blocks"))
        except Exception as e:  # noqa: BLE001 (report any error as the learner's)
            return CheckResult(False, tr("{where}: raised {error}: {message}", where=where,
                                         error=type(e).__name__, message=str(e)), {"case": kind})
        problem = _merge_problem(kind, inputs, expected, got)
        if problem is not None:
            return CheckResult(False, tr("{where}: {problem}", where=where, problem=problem),
                               {"case": kind})
    return CheckResult(True, tr("[ok] {name}: {total} cases passed, equal to attention over "
                                "both blocks' keys at once", name="merge_attention_blocks",
                                total=total))
