"""The pipeline bubble (06a1, 06a2), counted and measured.

Counted: ``ideal_timeline`` plays each rank's ordered operations (ours, or PyTorch's own
``pipeline_order``) on an ideal machine, where each takes its nominal time and messages are free.
Measured: timed steps of a schedule whose stages' compute is emulated (``emulated_stages.Delay``:
each stage sleeps a set time), the idle share of the ranks, and the gap before each operation
(message, wake-up, Python) read from the same timelines, which says why the two differ.

Every measurement repeats each configuration in rounds (A B C A B C ...) inside one launch, so
the noise of a shared machine hits all alike, and reports the median with min and max
(``lu.timing.Stats``). The first round warms up (first messages, first calls) and is not kept.
"""
from __future__ import annotations

from functools import partial
from statistics import mean, median

import torch
import torch.distributed as dist

from labutils.core.i18n import tr
from labutils.core.launcher import launch
from labutils.core.rank import progress
from labutils.core.timeline import bubble_fraction, flatten
from labutils.core.timing import Stats
from labutils.cost.step_time import bubble_fraction as predicted_bubble
from labutils.cost.step_time import pipeline_step
from labutils.experiments.pipeline_runs import observe_pipeline, observed_step
from labutils.parallel.model_parallel import boundary_shapes, split_model
from labutils.parallel.pipeline import (
    SCHEDULES,
    make_pipeline_mlp,
    stage_schedules,
    validate_config,
)


def measured_bubble(results, key="spans"):
    """Idle share of one step over all ranks (``lu.timeline.bubble_fraction``) of the ops
    (``spans``), or of the emulated work alone (``work_spans``), the one measure that sees
    inside PyTorch's executor as well as ours."""
    return bubble_fraction(flatten([r[key] for r in results]))


def makespan(results, key="spans"):
    spans = flatten([r[key] for r in results])
    return max(s.end for s in spans) - min(s.start for s in spans)


def emulated_model(n_stages, stage_forward_ms, microbatch_size, layers_per_stage=1,
                   weight_grad=False):
    """A model_fn whose every stage (of ``n_stages``) sleeps ``stage_forward_ms`` per
    micro-batch of ``microbatch_size`` forward and twice that backward."""
    n_layers = n_stages * layers_per_stage
    ms = stage_forward_ms / (microbatch_size * layers_per_stage)
    return partial(make_pipeline_mlp, n_layers, 16, 8, 4, [ms] * n_layers, 0, weight_grad)


def _batch(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g)


def timed_pipeline(world_size=4, n_microbatches=4, schedule="1f1b", batch_size=32,
                   ms_per_sample=0.25, layer_ms=None, sizes=None, n_layers=8, steps=2):
    """A pipeline whose layers sleep ``ms_per_sample`` per sample (forward; 2x backward).

    Returns the per-rank results of ``observe_pipeline`` (``spans``, ``work_spans``: last step).
    """
    layer_ms = layer_ms if layer_ms is not None else [ms_per_sample] * n_layers
    model_fn = partial(make_pipeline_mlp, len(layer_ms), 16, 8, 4, layer_ms)
    x, y = _batch(batch_size)
    return observe_pipeline(model_fn, x, y, world_size=world_size, schedule=schedule,
                            n_microbatches=n_microbatches, sizes=sizes, steps=steps)


def _rounds_worker(rank, world_size, model_fn, x, y, variants, microbatch_size, repeats):
    """Run every (schedule, m, sizes) of ``variants`` once per round; keep the timelines."""
    model = model_fn()
    stages = {sizes: split_model(model, world_size, sizes) for _, _, sizes in variants}
    shapes = {sizes: boundary_shapes(st, x[:microbatch_size])[rank] for sizes, st in stages.items()}
    kept = {v: [] for v in variants}
    for r in range(repeats + 1):
        for schedule, m, sizes in variants:
            stage = stages[sizes][rank]
            ops, prev_ops = stage_schedules(schedule, rank, world_size, m)
            x_mbs = x[:microbatch_size * m].chunk(m)
            y_mbs = y[:microbatch_size * m].chunk(m)
            dist.barrier()                       # every rank starts the step together
            _, _, spans, work = observed_step(rank, stage, ops, prev_ops, x_mbs, y_mbs,
                                              shapes[sizes], count_saved=False)
            stage.zero_grad(set_to_none=True)
            if r:                                # round 0 warms up
                kept[(schedule, m, sizes)].append({"spans": spans, "work_spans": work})
        progress(r + 1, repeats + 1, "rounds")
    return kept


def measure_rounds(model_fn, world_size, variants, microbatch_size=4, repeats=5, timeout=300.0,
                   warn_oversubscription=True):
    """Time every variant ``(schedule, m, sizes)`` (sizes: layers per stage, or None) of one
    model in ``repeats`` interleaved rounds, in one launch. Returns {variant: [per-rank results
    of each round]}, each result a dict of ``spans`` (ops) and ``work_spans`` (emulated work).
    ``warn_oversubscription=False`` when the compute is emulated: sleeping ranks leave the
    cores free (see ``lu.launch``)."""
    variants = [(s, m, None if sizes is None else tuple(sizes)) for s, m, sizes in variants]
    for schedule, m, sizes in variants:
        validate_config(len(model_fn()), world_size, microbatch_size * m, m, schedule, sizes)
    x, y = _batch(microbatch_size * max(m for _, m, _ in variants))
    per_rank = launch(_rounds_worker, model_fn, x, y, variants, microbatch_size, repeats,
                      world_size=world_size, timeout=timeout,
                      warn_oversubscription=warn_oversubscription)
    return {v: [[per_rank[rank][v][k] for rank in range(world_size)] for k in range(repeats)]
            for v in variants}


def op_gaps(results):
    """Seconds each op of a step started after it could have: after both its rank was free and
    the op it needs (F of the stage before, B of the stage after) had ended. What fills a gap
    is the message, waking the rank, and Python; the bubble formula counts none of it."""
    ops = {(s.rank, s.name, s.label): s for r in results for s in r["spans"]}
    gaps = []
    for rank, r in enumerate(results):
        previous_end = None
        for span in sorted(r["spans"], key=lambda s: s.start):
            src = rank - 1 if span.name == "forward" else rank + 1
            ready = [e for e in (previous_end, getattr(ops.get((src, span.name, span.label)),
                                                       "end", None)) if e is not None]
            if ready:
                gaps.append(max(0.0, span.start - max(ready)))
            previous_end = span.end
    return gaps


def latency_bubble(n_stages, n_microbatches, slot_s, gap_s):
    """Idle share when each of the m + p - 1 slots (a forward and a backward) also pays two
    gaps of ``gap_s`` (``lu.step_time.pipeline_step`` on a link of latency ``gap_s``), as
    measured from work spans: a gap is idle time."""
    step = pipeline_step(slot_s * n_stages * n_microbatches, n_stages, n_microbatches, 0,
                         (gap_s, 1e-30))   # latency only: no bytes are sent
    return 1 - step.compute / step.total


def gap_allowed(n_stages, n_microbatches, slot_s, margin=0.1):
    """The largest gap per op (seconds) for which ``latency_bubble`` stays within ``margin``
    of (p-1)/(m+p-1): solve 1 - m s / ((m+p-1)(s + 2g)) = (1 + margin)(p-1)/(m+p-1) for g."""
    p, m = n_stages, n_microbatches
    return slot_s / 2 * (m / (m + p - 1 - (1 + margin) * (p - 1)) - 1)


def measure_bubbles(stages=(2, 4), microbatches=(4, 8), schedules=("gpipe", "1f1b"),
                    repeats=5, stage_forward_ms=24.0, microbatch_size=4, timeout=300.0):
    """For each p, m and schedule: the measured bubble (Stats over ``repeats`` rounds), the
    formula, the gap before each op (``op_gaps``, seconds) measured on the same timelines, the
    bubble once the mean gap (``with_gaps``) or the median gap (``with_median_gap``: the
    typical op, without the rare long waits for a core) is added to every op, the largest gap
    that keeps the formula within 10% (``gap_allowed_s``), and the last round's timelines."""
    rows = []
    for p in stages:
        model_fn = emulated_model(p, stage_forward_ms, microbatch_size)
        variants = [(s, m, None) for m in microbatches for s in schedules]
        timed = measure_rounds(model_fn, p, variants, microbatch_size, repeats, timeout,
                               warn_oversubscription=False)      # emulated: ranks sleep
        slot_s = 3 * stage_forward_ms / 1e3
        for (schedule, m, _), runs in timed.items():
            gaps = [g for run in runs for g in op_gaps(run)]
            rows.append({"p": p, "m": m, "schedule": schedule,
                         "bubble": Stats.of([measured_bubble(run) for run in runs]),
                         "predicted": predicted_bubble(p, m),
                         "gap": Stats.of(gaps), "slot_s": slot_s,
                         "with_gaps": latency_bubble(p, m, slot_s, mean(gaps)),
                         "with_median_gap": latency_bubble(p, m, slot_s, median(gaps)),
                         "gap_allowed_s": gap_allowed(p, m, slot_s),
                         "timeline": runs[-1]})
    return rows


# ---- the schedule alone: every op takes its nominal time, messages are free ---------------

COSTS = {"F": 1, "B": 2, "I": 1, "W": 1}   # forward 1; backward 2, or input 1 + weight 1


def _needs(action, n_stages, actions):
    """The actions ``action`` waits for: F after F of the stage before; B or I after this
    stage's F and the B or I of the stage after; W after I."""
    kind, s, i = action
    if kind == "F":
        return [("F", s - 1, i)] if s else []
    if kind == "W":
        return [("I", s, i)]
    later = [] if s == n_stages - 1 else [next((k, s + 1, i) for k in "BI"
                                               if (k, s + 1, i) in actions)]
    return [("F", s, i)] + later


def ideal_timeline(actions_by_rank, costs=COSTS, stage_weights=None, overhead=0.0):
    """Run the ranks' ordered actions ``(kind, stage, microbatch)`` on an ideal machine: each
    starts when its rank is free and its inputs exist (``_needs``), and takes ``costs[kind]``
    times ``stage_weights[stage]`` (1 if not given), plus ``overhead`` (a measured wait per
    action, idle time: 0 on the ideal machine). Returns {action: (rank, start, end)}; raises
    ValueError if the order deadlocks."""
    n_stages = 1 + max(a[1] for acts in actions_by_rank for a in acts)
    done, free, nxt = {}, [0] * len(actions_by_rank), [0] * len(actions_by_rank)
    kinds = {a for acts in actions_by_rank for a in acts}

    def needs(*action):
        return _needs(action, n_stages, kinds)

    while any(n < len(acts) for n, acts in zip(nxt, actions_by_rank)):
        progressed = False
        for r, acts in enumerate(actions_by_rank):
            if nxt[r] < len(acts) and all(d in done for d in needs(*acts[nxt[r]])):
                a = acts[nxt[r]]
                start = max([free[r]] + [done[d][2] for d in needs(*a)])
                end = start + costs[a[0]] * (stage_weights[a[1]] if stage_weights else 1) + overhead
                done[a] = (r, start, end)
                free[r], nxt[r], progressed = end, nxt[r] + 1, True
        if not progressed:
            stuck = [tr("rank {r} at {kind}{i} of stage {s}", r=r, kind=acts[nxt[r]][0],
                        i=acts[nxt[r]][2], s=acts[nxt[r]][1])
                     for r, acts in enumerate(actions_by_rank) if nxt[r] < len(acts)]
            raise ValueError(tr("deadlock: {stuck} (each waits for another)",
                                stuck=", ".join(stuck)))
    return done


def ideal_makespan(actions_by_rank, costs=COSTS, stage_weights=None):
    """The step time of ``ideal_timeline``, in units of one forward."""
    return max(end for _, _, end in ideal_timeline(actions_by_rank, costs,
                                                     stage_weights).values())


def ideal_bubble(actions_by_rank, costs=COSTS, stage_weights=None, overhead=0.0):
    """Idle share of ``ideal_timeline``: 1 - busy / (ranks x window). ``overhead`` per action
    counts as idle and precedes the action's work (as its gap does); the window runs from the
    first work's start to the last work's end, the window ``measured_bubble`` reads from
    ``work_spans``, so the first action's wait falls outside it."""
    timeline = ideal_timeline(actions_by_rank, costs, stage_weights, overhead)
    window = (max(end for _, _, end in timeline.values())
              - min(start for _, start, _ in timeline.values()) - overhead)
    busy = sum(end - start - overhead for _, start, end in timeline.values())
    return 1 - busy / (len(actions_by_rank) * window)


# ---- inside PyTorch's schedules: the actions' own spans -----------------------------------

def action_order(action_spans_by_rank):
    """Each rank's actions ``(kind, stage, microbatch)`` in the order they ran (from
    ``stage_observers.action_spans``): the order to play on the ideal machine."""
    return [[(s.name, *_label(s)) for s in sorted(spans, key=lambda s: s.start)]
            for spans in action_spans_by_rank]


def _label(span):
    stage, microbatch = span.label.strip("()").split(",")
    return int(stage), int(microbatch)


def action_overheads(action_spans_by_rank, work_spans_by_rank):
    """Seconds each action of one step lost to what the ideal machine leaves out, measured on
    its rank: ``gaps``, from when it could start (its rank free and the actions it needs
    (``_needs``) done, on any rank) to the start of its call (waits for messages, the
    schedule's own Python); ``inside``, its call minus the emulated work (sleeps) within it
    (the stage's bookkeeping and its real arithmetic). Returns {"gaps": [...], "inside": [...]}."""
    order = action_order(action_spans_by_rank)
    n_stages = 1 + max(a[1] for acts in order for a in acts)
    every = {a for acts in order for a in acts}
    ends = {a: s.end for acts, spans in zip(order, action_spans_by_rank)
            for a, s in zip(acts, sorted(spans, key=lambda s: s.start))}
    gaps, inside = [], []
    for acts, spans, work in zip(order, action_spans_by_rank, work_spans_by_rank):
        previous_end = None
        for a, span in zip(acts, sorted(spans, key=lambda s: s.start)):
            ready = [ends[d] for d in _needs(a, n_stages, every)]
            ready += [] if previous_end is None else [previous_end]
            if ready:
                gaps.append(max(0.0, span.start - max(ready)))
            slept = sum(w.end - w.start for w in work
                        if span.start <= w.start and w.end <= span.end)
            inside.append(span.end - span.start - slept)
            previous_end = span.end
    return {"gaps": gaps, "inside": inside}


def stage_per_rank(schedule, n_stages, n_microbatches):
    """Our schedules (stage s on rank s) as ``ideal_timeline``'s actions."""
    fn = SCHEDULES[schedule] if isinstance(schedule, str) else schedule
    return [[(op, s, i) for op, i in fn(s, n_stages, n_microbatches)] for s in range(n_stages)]
