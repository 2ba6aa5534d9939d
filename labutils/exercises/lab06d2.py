"""Exercise checker of lab 06d2: merging two key blocks' attention with the online softmax (ring
attention). Registered in ``labutils.course``; notebooks call it as ``lu.check_<name>``. Every
sentence a student reads goes through ``tr`` (its Chinese: ``exercises/locale/zh.po``)."""
import torch

from labutils.core.i18n import tr
from labutils.exercises.base import (
    CheckResult,
    first_difference,
    not_implemented,
)
from labutils.parallel.online_softmax import (  # noqa: F401 (the reference)
    block_attention,
    causal_mask,
    merge_attention_blocks,
)

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
