"""Exercise checkers of lab 06a: the 1F1B order of one stage. Registered in ``labutils.course``; notebooks call
them as ``lu.check_<name>``."""
import torch
import torch.distributed as dist

from labutils.core.i18n import tr
from labutils.exercises.base import make_cases, run_check
from labutils.experiments.pipeline_bubble import ideal_timeline, stage_per_rank
from labutils.parallel.model_parallel import boundary_shapes, split_model
from labutils.parallel.pipeline import (
    make_pipeline_mlp,
    one_f_one_b_schedule,
    pipeline_worker,
    reference_train,
    schedule_problem,
)


def _as_text(ops):
    return [f"{op}{i}" for op, i in ops]


def _one_f_one_b_harness(rank, world_size, learner_fn, seed, n_microbatches):
    from functools import partial
    ops = {s: list(learner_fn(s, world_size, n_microbatches)) for s in range(world_size)}
    problems = {s: schedule_problem(ops[s], n_microbatches) for s in ops}
    expected_order = _as_text(one_f_one_b_schedule(rank, world_size, n_microbatches))
    problems = {tr("stage {s}: {problem}", s=s, problem=p): p for s, p in problems.items()}
    if not any(problems.values()):      # a valid list per stage: do the stages deadlock?
        try:
            ideal_timeline(stage_per_rank(lambda s, p, m: ops[s], world_size, n_microbatches))
        except ValueError as e:         # would hang on real ranks: say where instead
            problems = {str(e): True}
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
    """Check ``learner_fn(stage, n_stages, n_microbatches) -> [("F", 0), ("B", 0), ...]``: run
    it as the schedule of a real pipeline (gradients must equal one process's) and compare its
    order with 1F1B's."""
    cases = make_cases(world_sizes=(2, 3, 4), per_world_size=1, seed=6,
                       n_microbatches=[2, 5, 6])
    return run_check("one_f_one_b_schedule", learner_fn, _one_f_one_b_harness, cases,
                     timeout=timeout)
