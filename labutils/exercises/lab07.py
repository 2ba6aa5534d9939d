"""Exercise checkers of lab 07: the bytes one GPU sends for data parallelism with Megatron's
fp32 main gradients; the fewest micro-batches that bring an interleaved pipeline's bubble under
a target (and exercise 3's reference, ``tp_or_pp``). Registered in ``labutils.course``;
notebooks call them as ``lu.check_<name>``. Both run in this process (arithmetic, no ranks)
and name the typical mistake a wrong answer matches on every case."""
import dataclasses
import math
import numbers

from labutils.core.i18n import tr
from labutils.cost import planner as pl
from labutils.cost import published as pub
from labutils.exercises.base import CheckResult, call_learner, not_implemented, require_function


def dp_bytes_per_gpu(num_params, dp, zero):
    """Reference of exercise 1: bytes one GPU sends per step for the data-parallel traffic of
    ``num_params`` parameters over ``dp`` ranks, ring collectives, Megatron's fp32 main
    gradients (4 bytes). zero=0: one all-reduce of the gradients, a reduce-scatter and an
    all-gather that each send (dp-1)/dp of the buffer; zero=1 (the distributed optimizer):
    reduce-scatter the gradients, then all-gather the updated bf16 weights (2 bytes)."""
    share = (dp - 1) / dp
    if zero == 0:
        return 2 * share * 4 * num_params
    return share * 4 * num_params + share * 2 * num_params


def fewest_micro_batches(p, v, share):
    """Reference of exercise 2: the fewest micro-batches m per pipeline for which the bubble's
    share of the step, (p-1)/(v m + p - 1), is at most ``share``; with v > 1 (Megatron's
    interleaved schedule) m must be a multiple of p."""
    step = p if v > 1 else 1
    m = step
    while (p - 1) / (v * m + p - 1) > share:
        m += step
    return m


def _dp_mistakes():
    """Typical wrong answers to exercise 1, (function, what is wrong), tried in this order."""
    ref = dp_bytes_per_gpu
    return (
        (lambda n, d, z: 4 * (d - 1) / d * n,
         tr("the gradients travel as Megatron keeps them, fp32 main gradients of 4 bytes, and an "
            "all-reduce is a reduce-scatter and an all-gather: with 2-byte gradients, or half an "
            "all-reduce, you get half the bytes")),
        (lambda n, d, z: 8 * (d - 1) / d * n,
         tr("with zero=1 the second half of the traffic gathers the updated bf16 weights (2 "
            "bytes each), not the fp32 gradients")),
        (lambda n, d, z: ref(n, d, 0) if z == 0 else 4 * (d - 1) / d * n,
         tr("with zero=1 each GPU also all-gathers the updated bf16 weights after its optimizer "
            "step")),
        (lambda n, d, z: ref(n, d, z) * d / (d - 1),
         tr("in a ring each phase sends (dp-1)/dp of the buffer from each GPU, not all of it")),
        (lambda n, d, z: ref(n, d, z) / (d - 1),
         tr("each phase of a ring sends (dp-1)/dp of the buffer from each GPU, not 1/dp of it")),
        (lambda n, d, z: ref(n, d, z) * d,
         tr("that is what all dp GPUs send together; return the bytes one GPU sends")),
    )


def _micro_batch_mistakes():
    """Typical wrong answers to exercise 2, (function, what is wrong), tried in this order."""
    def fewest(p, v, share, bubble, step):
        m = step
        while bubble(p, v, m) > share:
            m += step
        return m

    def plain(p, v, m):
        return (p - 1) / (m + p - 1)

    def over_busy(p, v, m):
        return (p - 1) / (v * m)

    def mine(p, v, m):
        return (p - 1) / (v * m + p - 1)
    return (
        (lambda p, v, s: fewest(p, v, s, mine, 1),
         tr("Megatron's interleaved schedule needs the micro-batches to be a multiple of p")),
        (lambda p, v, s: fewest(p, v, s, plain, p if v > 1 else 1),
         tr("with v model chunks per rank the fill and drain last 1/v as long: the share is "
            "(p-1)/(v m + p - 1)")),
        (lambda p, v, s: fewest(p, v, s, plain, 1),
         tr("with v model chunks per rank the share is (p-1)/(v m + p - 1), and the interleaved "
            "schedule needs a multiple of p micro-batches")),
        (lambda p, v, s: fewest(p, v, s, over_busy, p if v > 1 else 1),
         tr("(p-1)/(v m) is the bubble over the busy time; the share of the step is "
            "(p-1)/(v m + p - 1)")),
        (lambda p, v, s: fewest_micro_batches(p, v, s) - (p if v > 1 else 1),
         tr("that m still leaves a bubble above the target: return the fewest m that reaches "
            "it")),
        (lambda p, v, s: fewest_micro_batches(p, v, s) + (p if v > 1 else 1),
         tr("a smaller m already reaches the target: return the fewest")),
    )


_DP_CASES = ((7.5e9, 64, 0), (7.5e9, 64, 1), (1.3e9, 2, 0), (1.3e9, 2, 1), (175e9 / 128, 8, 1),
             (175e9 / 128, 8, 0))
_MB_CASES = ((8, 1, 0.045), (8, 2, 0.05), (16, 8, 0.02), (35, 3, 0.04), (4, 2, 0.1),
             (16, 1, 0.11))


def _check(name, learner_fn, reference, cases, mistakes, describe, unit, hint):
    """Run ``learner_fn`` on every case; pass if it matches ``reference`` on all, else name the
    first typical mistake that explains every answer, or ``hint``."""
    require_function(name, learner_fn)
    got = []
    for number, case in enumerate(cases, 1):
        where = tr("[wrong] {name}: case {number} of {total} ({case})", name=name,
                   number=number, total=len(cases), case=describe(*case))
        value, failed = call_learner(name, learner_fn, where, *case)
        if failed:
            return failed
        if value is None:
            return CheckResult(False, not_implemented(name))
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            return CheckResult(False, tr("{where}: expected a number ({unit}), got {type} "
                                         "{got!r}", where=where, unit=unit,
                                         type=type(value).__name__, got=value))
        got.append((where, float(value)))
    wrong = [(case, where, value) for case, (where, value) in zip(cases, got)
             if not math.isclose(value, reference(*case), rel_tol=1e-9)]
    if not wrong:
        return CheckResult(True, tr("[ok] {name}: {total} cases passed", name=name,
                                    total=len(cases)))
    why = next((text for fn, text in mistakes
                if all(math.isclose(value, fn(*case), rel_tol=1e-9)
                       for case, (where, value) in zip(cases, got))), hint)
    case, where, value = wrong[0]
    return CheckResult(False, f"{where}: " + tr("expected {e}, got {g}",
                                                e=f"{reference(*case):.4g}",
                                                g=f"{value:.4g}") + f": {why}")


def check_dp_bytes_per_gpu(learner_fn):
    """Check ``learner_fn(num_params, dp, zero)`` -> bytes one GPU sends per step (zero 0 or 1,
    fp32 gradients, bf16 weights), on six cases; no processes."""
    return _check("dp_bytes_per_gpu", learner_fn, dp_bytes_per_gpu, _DP_CASES, _dp_mistakes(),
                  lambda n, d, z: f"num_params={n:g}, dp={d}, zero={z}", tr("bytes"),
                  tr("count each collective's bytes per GPU: a ring reduce-scatter or all-gather "
                     "of n bytes sends (dp-1)/dp x n from each GPU"))


def check_fewest_micro_batches(learner_fn):
    """Check ``learner_fn(p, v, share)`` -> the fewest micro-batches m (a multiple of p when
    v > 1) whose bubble share (p-1)/(v m + p - 1) is at most ``share``; no processes."""
    return _check("fewest_micro_batches", learner_fn, fewest_micro_batches, _MB_CASES,
                  _micro_batch_mistakes(), lambda p, v, s: f"p={p}, v={v}, share={s:g}",
                  tr("micro-batches"),
                  tr("solve (p-1)/(v m + p - 1) <= share for m, then round up (to a multiple "
                     "of p when v > 1)"))


def tp_or_pp(hardware="A100-80GB"):
    """Reference of exercise 3: GPT 310.1B on 1,920 A100s (Narayanan et al.'s row, batch 2160,
    full recomputation), three ways to split the 1,920 GPUs; per layout its model TFLOP/s per
    GPU, whether it fits, and its terms (seconds per step). One schedule for all: 1F1B,
    not interleaved (72 micro-batches per pipeline at dp 30 are no multiple of 16)."""
    row = next(r for r in pub.narayanan2021() if r["params_billion"] == 310.1)
    out = {}
    for dp, tp, pp in ((30, 4, 16), (15, 8, 16), (15, 16, 8)):
        layout = dataclasses.replace(row["layout"], dp=dp, tp=tp, pp=pp, virtual_stages=1)
        pred = pl.predict(row["model"], layout, row["batch_size"], hardware, recompute="full")
        out[f"dp{dp} tp{tp} pp{pp}"] = (round(pred.tflops_per_gpu, 1), pred.fits,
                                        {k: round(v, 2) for k, v in pred.terms.items() if v})
    return out
