"""Exercise checkers of lab 06a1: the 1F1B order of one stage. Registered in ``labutils.course``;
notebooks call them as ``lu.check_<name>``.

Before any rank starts, the learner's lists are compared with typical wrong orders (GPipe's, a
warm-up one forward too long or too short, one that forgets m, a missing drain) on small
pipelines where each gives lists of its own; a match is named in a sentence. Then the lists are
played on the ideal machine (a deadlock is reported, not waited for) and run as a real pipeline
whose gradients must equal one process's."""
import torch
import torch.distributed as dist

from labutils.core.i18n import tr
from labutils.exercises.base import CheckResult, call_learner, make_cases, run_check
from labutils.experiments.pipeline_bubble import ideal_timeline, stage_per_rank
from labutils.parallel.model_parallel import boundary_shapes, split_model
from labutils.parallel.pipeline import (
    gpipe_schedule,
    make_pipeline_mlp,
    one_f_one_b_schedule,
    pipeline_worker,
    reference_train,
    schedule_problem,
)

# (p, m) pipelines on which the typical mistakes below give lists unlike 1F1B's and unlike each
# other's: m >= p shows the warm-up, m < p - 1 the forgotten min(., m)
_SHAPES = ((4, 6), (3, 5), (4, 2))


def _with_warmup(warmup, drain=True):
    """1F1B's shape with another warm-up length (a function of s, p, m), or without the drain."""
    def schedule(stage, n_stages, n_microbatches):
        w = warmup(stage, n_stages, n_microbatches)
        ops = [("F", i) for i in range(w)]
        for i in range(max(0, n_microbatches - w)):
            ops += [("F", w + i), ("B", i)]
        if drain:
            ops += [("B", i) for i in range(max(0, n_microbatches - w), n_microbatches)]
        return ops
    return schedule


def _mistakes():
    """Typical wrong orders, (schedule function, what is wrong), tried in this order."""
    return (
        (gpipe_schedule, tr("That is GPipe's order: every forward before any backward. It trains "
                            "correctly, but stage s holds all m micro-batches; 1F1B starts its "
                            "backwards after p - s - 1 warm-up forwards.")),
        (_with_warmup(lambda s, p, m: min(s, m)),
         tr("Stage s warms up with s forwards instead of p - s - 1, the wrong way round: the first "
            "stage then waits for a backward that the last stage cannot start yet, so the pipeline "
            "deadlocks.")),
        (_with_warmup(lambda s, p, m: min(p - s, m)),
         tr("Stage s warms up with p - s forwards, one more than 1F1B's p - s - 1. The order still "
            "runs, but every stage holds one micro-batch's activations more than it needs.")),
        (_with_warmup(lambda s, p, m: min(p - s - 2, m) if p - s >= 2 else 0),
         tr("Stage s warms up with p - s - 2 forwards, one fewer than 1F1B's p - s - 1. The order "
            "still runs, but each stage waits for a backward while it could run a forward: the "
            "bubble grows.")),
        (_with_warmup(lambda s, p, m: p - s - 1),
         tr("With fewer micro-batches than stages the warm-up runs forwards of micro-batches that "
            "do not exist: warm up with min(p - s - 1, m) forwards.")),
        (_with_warmup(lambda s, p, m: min(p - s - 1, m), drain=False),
         tr("The last backwards are missing: after the steady state, drain the backwards of the "
            "micro-batches still held.")),
    )


def _lists(schedule, p, m):
    return [[tuple(op) for op in schedule(s, p, m)] for s in range(p)]


def typical_mistake(learner_fn):
    """(None, None) when the learner's lists match no typical mistake on ``_SHAPES``; else
    (None, the mistake's sentence) or (a CheckResult for a stub or an error, None)."""
    got = {}
    for p, m in _SHAPES:
        lists = []
        for s in range(p):
            ops, failed = call_learner("one_f_one_b_schedule", learner_fn,
                                       tr("stage {s} of {p}, m={m}", s=s, p=p, m=m), s, p, m)
            if failed:
                return failed, None
            try:
                lists.append([tuple(op) for op in ops])
            except TypeError:
                return None, None        # not a list of pairs: the run names what is wrong
        got[(p, m)] = lists
    if all(got[(p, m)] == _lists(one_f_one_b_schedule, p, m) for p, m in _SHAPES):
        return None, None
    for wrong, why in _mistakes():
        if all(got[(p, m)] == _lists(wrong, p, m) for p, m in _SHAPES):
            return None, why
    return None, None


def _as_text(ops):
    return [f"{op}{i}" for op, i in ops]


def _one_f_one_b_harness(rank, world_size, learner_fn, seed, n_microbatches):
    from functools import partial
    ops = {s: list(learner_fn(s, world_size, n_microbatches)) for s in range(world_size)}
    problems = {s: schedule_problem(ops[s], n_microbatches) for s in ops}
    expected_order = _as_text(one_f_one_b_schedule(rank, world_size, n_microbatches))
    problems = {tr("Stage {s}'s list is not a schedule ({problem}): every micro-batch needs "
                   "one forward, then one backward.", s=s, problem=p): p
                for s, p in problems.items()}
    if not any(problems.values()):      # a valid list per stage: do the stages deadlock?
        try:
            ideal_timeline(stage_per_rank(lambda s, p, m: ops[s], world_size, n_microbatches))
        except ValueError as e:         # would hang on real ranks: say where instead
            problems = {tr("Your lists would deadlock on real ranks ({why}): a stage can run a "
                           "backward only after the stage after it has run that backward.",
                           why=e): True}
    if any(problems.values()):          # every rank sees it: none of them starts sending
        dist.barrier()                  # no rank leaves while a peer is still connecting
        problem = next(k for k, p in problems.items() if p)
        return {tr("schedule"): tr("valid")}, {tr("schedule"): problem}   # no pipeline runs
    model_fn = partial(make_pipeline_mlp, world_size + 1, 6, 5, 3, None, seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2 * n_microbatches, 5, generator=g)
    y = torch.randn(2 * n_microbatches, 3, generator=g)
    reference = reference_train(model_fn, x, y)
    shapes = boundary_shapes(split_model(model_fn(), world_size), x[:2])
    got = pipeline_worker(rank, world_size, model_fn, x, y, shapes,
                          schedule=lambda s, p, m: ops[s], n_microbatches=n_microbatches)
    # the forwards before B0 first: one number names the usual mistakes (GPipe's m, one too many)
    before_b0 = tr("forwards before the first backward (1F1B: min(p - s, m))")
    gradients, order = tr("gradients"), tr("order")
    mine = _as_text(ops[rank])
    expected = {gradients: {n: reference["grads"][n] for n in got["grads"]},
                before_b0: expected_order.index("B0"), order: expected_order}
    return expected, {gradients: got["grads"], before_b0: mine.index("B0"), order: mine}


def check_one_f_one_b_schedule(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(stage, n_stages, n_microbatches) -> [("F", 0), ("B", 0), ...]``: name
    a typical mistake before any rank starts; else run it as the schedule of a real pipeline
    (gradients must equal one process's) and compare its order with 1F1B's."""
    failed, why = typical_mistake(learner_fn)
    if failed:
        return failed
    if why:
        return CheckResult(False, tr("[wrong] {name}: {why}", name="one_f_one_b_schedule", why=why))
    cases = make_cases(world_sizes=(2, 3, 4), per_world_size=1, seed=6,
                       n_microbatches=[2, 5, 6])
    return run_check("one_f_one_b_schedule", learner_fn, _one_f_one_b_harness, cases,
                     timeout=timeout)
