"""labutils.parallel.pipeline: GPipe and 1F1B from send/recv, checked against one process; counted
and measured bubbles; the 1F1B checker (lab 06a1). PyTorch's schedules: test_torch_pipeline.py."""
import warnings
from functools import partial

import pytest
import torch

import labutils as lu
from labutils import model_parallel as mp
from labutils import pipeline as pl
from labutils import pipeline_bubble as pb
from labutils import pipeline_runs as runs_
from labutils import stage_observers as obs
from labutils.exercises import lab06a1
from labutils.core.timeline import Span

from .checkers import assert_check, checker_cases

pytestmark = pytest.mark.lab06a1

MODEL = partial(pl.make_pipeline_mlp, 8, 24, 16, 4)


def _batch(n=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, generator=g), torch.randn(n, 4, generator=g)


def _in_flight(ops):
    held = peak = 0
    for op, _ in ops:
        held += 1 if op == "F" else -1
        peak = max(peak, held)
    return peak


# ---- schedules: pure logic ----------------------------------------------------------------

@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
def test_schedules_are_valid_and_bound_activations(p, m):
    for s in range(p):
        gpipe = pl.gpipe_schedule(s, p, m)
        ofob = pl.one_f_one_b_schedule(s, p, m)
        assert pl.schedule_problem(gpipe, m) is None
        assert pl.schedule_problem(ofob, m) is None
        assert _in_flight(gpipe) == m
        assert _in_flight(ofob) == min(p - s, m)     # 1F1B's whole point


def test_one_f_one_b_order_spelled_out():
    text = lambda ops: " ".join(f"{o}{i}" for o, i in ops)
    assert text(pl.one_f_one_b_schedule(0, 4, 5)) == "F0 F1 F2 F3 B0 F4 B1 B2 B3 B4"
    assert text(pl.one_f_one_b_schedule(2, 4, 5)) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4"
    assert text(pl.one_f_one_b_schedule(3, 4, 3)) == "F0 B0 F1 B1 F2 B2"


def test_schedule_problem_names_the_mistake():
    assert pl.schedule_problem([("B", 0), ("F", 0)], 1) == "B0 before F0"
    assert pl.schedule_problem([("F", 0)], 1) == "B0 appears 0 times"


def test_received_before_releases_only_gradients_already_taken():
    prev = pl.one_f_one_b_schedule(0, 2, 3)            # F0 F1 B0 F2 B1 B2
    assert pl.received_before(prev) == {0: set(), 1: set(), 2: {0}}


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 5, 8, 16])
def test_ideal_machine_counts_the_bubble_formula_for_both_schedules(p, m):
    for schedule in ("gpipe", "1f1b"):
        counted = pb.ideal_bubble(pb.stage_per_rank(schedule, p, m))
        assert counted == pytest.approx(pl.predicted_bubble(p, m), abs=1e-12)
        assert pb.ideal_makespan(pb.stage_per_rank(schedule, p, m)) == 3 * (m + p - 1)


def _warmup_s(stage, n_stages, n_microbatches):      # a typical mistake: warm-up of s forwards
    w = min(stage, n_microbatches)
    ops = [("F", i) for i in range(w)]
    for i in range(n_microbatches - w):
        ops += [("F", w + i), ("B", i)]
    return ops + [("B", i) for i in range(n_microbatches - w, n_microbatches)]


def test_ideal_machine_reports_a_deadlock_instead_of_hanging():
    assert pl.schedule_problem(_warmup_s(0, 4, 5), 5) is None      # each list alone is valid
    with pytest.raises(ValueError, match=r"deadlock: rank 0 at B0 of stage 0"):
        pb.ideal_timeline(pb.stage_per_rank(_warmup_s, 4, 5))


def test_ideal_machine_weights_stages_by_cost():
    costs = mp.stage_costs([1, 1, 1, 1, 1, 1, 3, 3], [2, 2, 2, 2])          # [2, 2, 2, 6]
    one_stage_slow = pb.ideal_makespan(pb.stage_per_rank("1f1b", 4, 8), stage_weights=costs)
    # the slow stage runs m forward+backward pairs of 18 units; the fast ones fill and drain
    assert one_stage_slow == 8 * 18 + 3 * 2 + 3 * 4
    assert pb.ideal_makespan(pb.stage_per_rank("1f1b", 4, 8), stage_weights=[3] * 4) == 9 * 11


def test_saved_bytes_counts_while_the_graph_lives():
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    memory = obs.SavedBytes(lin)
    with memory.saving(0):
        y0 = torch.tanh(lin(x))           # saves x (Linear) and tanh's output: 2 x 4 x 8 floats
    with memory.saving(1):
        y1 = torch.tanh(lin(x[:2]))       # a view of x: its own 2 rows, then tanh's 2 x 8
    assert memory.bytes == memory.peak_bytes == (2 * 32 + 2 * 16) * 4
    assert memory.peak_microbatches == 2
    y0.sum().backward()                   # frees micro-batch 0's graph
    assert memory.bytes == 2 * 16 * 4
    y1.sum().backward()
    assert memory.bytes == 0 and memory.live == {} and not memory.by_label


def test_stage_spans_time_forward_and_backward_from_outside():
    stage = pl.make_pipeline_mlp(2, 8, 4, 2)
    x = torch.randn(2, 4)
    tl = lu.timeline.Timeline(0)
    memory = obs.SavedBytes(stage)
    with obs.stage_spans(stage, tl, labels=[3, 5]), memory.per_forward(stage, [3, 5]):
        a, b = stage(x), stage(x)
        assert memory.peak_microbatches == 2 and set(memory.by_label) == {3, 5}
        b.sum().backward()
        a.sum().backward()
    assert [(s.name, s.label) for s in tl.spans] == [
        ("forward", "3"), ("forward", "5"), ("backward", "5"), ("backward", "3")]
    assert all(s.end >= s.start for s in tl.spans) and memory.bytes == 0
    stage(x).sum().backward()                           # the hooks are gone
    assert len(tl.spans) == 4 and memory.peak_microbatches == 2


def test_delay_changes_no_value_and_splits_backward_when_asked():
    plain = pl.make_pipeline_mlp(3, 8, 4, 2)
    emulated = pl.make_pipeline_mlp(3, 8, 4, 2, [0.01] * 3, 0, True)
    x = torch.randn(5, 4)
    assert torch.equal(plain(x), emulated(x))
    plain(x).sum().backward()
    emulated(x).sum().backward()
    extra = {n: p.grad for n, p in emulated.named_parameters() if n.endswith("emulated_weight")}
    assert len(extra) == 3 and all(g.item() == 0 for g in extra.values())
    for (n, p), (_, q) in zip(plain.named_parameters(),
                              [(n, q) for n, q in emulated.named_parameters() if n not in extra]):
        assert torch.equal(p.grad, q.grad), n
    obs.work_spans([emulated], 0)                     # the runs above, read and cleared
    emulated(x).sum().backward()
    spans = obs.work_spans([emulated], 0)
    assert sorted(s.name for s in spans) == ["B"] * 3 + ["F"] * 3 + ["W"] * 3
    assert all(s.rank == 0 and s.end >= s.start for s in spans) and obs.work_spans([emulated], 0) == []


def test_op_gaps_and_latency_model():
    def span(rank, name, i, start, end):
        return Span(rank, name, start, end, str(i))
    # stage 1 starts F0 0.5 after stage 0 ends it; stage 0 starts B0 0.25 after stage 1 ends it
    results = [{"spans": [span(0, "forward", 0, 0, 1), span(0, "backward", 0, 4.25, 6)]},
               {"spans": [span(1, "forward", 0, 1.5, 2.5), span(1, "backward", 0, 2.5, 4)]}]
    assert sorted(pb.op_gaps(results)) == [0.0, 0.25, 0.5]
    assert pb.latency_bubble(4, 8, 0.03, 0.0) == pytest.approx(pl.predicted_bubble(4, 8))
    slot, gap = 0.03, 0.001    # two gaps per slot: m slots of work in (m + p - 1) longer slots
    assert pb.latency_bubble(4, 8, slot, gap) == pytest.approx(1 - 8 * slot / (11 * (slot + 2 * gap)))
    for p, m in ((2, 4), (2, 8), (4, 4), (4, 8)):   # the allowed gap puts the model at +10% exactly
        allowed = pb.gap_allowed(p, m, slot)
        assert allowed > 0
        assert pb.latency_bubble(p, m, slot, allowed) == pytest.approx(1.1 * pl.predicted_bubble(p, m))


def test_bad_configurations_raise_before_any_process():
    x, y = _batch(24)
    with pytest.raises(ValueError, match="cannot be split into 5 equal micro-batches"):
        runs_.run_pipeline(MODEL, x, y, world_size=2, n_microbatches=5)
    with pytest.raises(ValueError, match="cannot split a model of 8 layers into 9 stages"):
        runs_.observe_pipeline(MODEL, x, y, world_size=9, n_microbatches=4)
    with pytest.raises(ValueError, match="unknown schedule"):
        runs_.run_pipeline(MODEL, x, y, schedule="zigzag")
    with pytest.raises(ValueError, match="cannot be split into 7"):
        runs_.run_torch_pipeline(MODEL, x, y, n_microbatches=7)
    with pytest.raises(ValueError, match="unknown schedule"):
        runs_.run_torch_pipeline(MODEL, x, y, schedules=("gpipe", "zigzag"))
    with pytest.raises(ValueError, match="one cost per layer"):
        pl.make_pipeline_mlp(4, layer_ms=[1.0])


# ---- real ranks: equal to one process -------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("world_size,schedule,m", [
    (2, "gpipe", 4), (2, "1f1b", 6), (3, "1f1b", 2), (4, "gpipe", 3), (4, "1f1b", 8),
    (4, "1f1b", 1)])
def test_pipeline_trains_like_one_process(world_size, schedule, m):
    x, y = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = runs_.run_pipeline(MODEL, x, y, world_size=world_size, schedule=schedule,
                                     n_microbatches=m, steps=3)
    ref = pl.reference_train(MODEL, x, y, steps=3)
    torch.testing.assert_close(results[-1]["losses"], ref["losses"])
    grads = mp.merge_stage_results(results, "grads")
    assert set(grads) == set(ref["grads"])
    torch.testing.assert_close(grads, ref["grads"])
    torch.testing.assert_close(mp.merge_stage_results(results, "params"), ref["params"])


@pytest.mark.slow
@pytest.mark.parametrize("world_size,schedule,m", [(2, "gpipe", 4), (3, "1f1b", 6)])
def test_observing_a_pipeline_changes_no_number_and_sees_every_op(world_size, schedule, m):
    x, y = _batch()
    model_fn = partial(pl.make_pipeline_mlp, 8, 24, 16, 4, [0.02] * 8)   # sleeps: work spans
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = runs_.run_pipeline(model_fn, x, y, world_size=world_size, schedule=schedule,
                                   n_microbatches=m, steps=2)
        seen = runs_.observe_pipeline(model_fn, x, y, world_size=world_size, schedule=schedule,
                                      n_microbatches=m, steps=2)
    for key in ("grads", "params"):           # the observers are hooks: bit-identical numbers
        a, b = mp.merge_stage_results(plain, key), mp.merge_stage_results(seen, key)
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a), key
    assert plain[-1]["losses"] == seen[-1]["losses"]
    for rank, r in enumerate(seen):
        ops = pl.SCHEDULES[schedule](rank, world_size, m)
        names = {"F": "forward", "B": "backward"}
        assert sorted((s.name, s.label) for s in r["spans"]) == \
            sorted((names[op], str(i)) for op, i in ops), rank
        assert all(s.rank == rank for s in r["spans"] + r["work_spans"])
        work = [s.name for s in r["work_spans"]]
        layers = len(mp.split_model(model_fn(), world_size)[rank])
        assert sorted(work) == ["B"] * (layers * m) + ["F"] * (layers * m), rank
    # a backward span starts after its forward span ended, on every stage
    for r in seen:
        f = {s.label: s for s in r["spans"] if s.name == "forward"}
        assert all(s.start >= f[s.label].end for s in r["spans"] if s.name == "backward")


@pytest.mark.slow
def test_measure_rounds_keeps_every_round_of_every_variant():
    model_fn = pb.emulated_model(2, 0.4, 2)
    timed = pb.measure_rounds(model_fn, 2, [("gpipe", 2, None), ("1f1b", 4, (1, 1))],
                              microbatch_size=2, repeats=2)
    assert set(timed) == {("gpipe", 2, None), ("1f1b", 4, (1, 1))}
    for (schedule, m, _), runs in timed.items():
        assert len(runs) == 2
        for run in runs:
            for rank, result in enumerate(run):
                ops = sorted((s.name, s.label) for s in result["spans"])
                assert ops == sorted((n, str(i)) for n in ("forward", "backward")
                                     for i in range(m)), (schedule, rank)
                assert sorted(s.name for s in result["work_spans"]) == ["B"] * m + ["F"] * m
            assert 0 <= pb.measured_bubble(run) < 1
            assert len(pb.op_gaps(run)) == 4 * m - 1     # every op but stage 0's first


# ---- the bubble, measured from a timeline ---------------------------------------------------
# The measured bubble against (p-1)/(m+p-1) is a timing, so it is a target of
# `python -m labutils.bench pipeline`, not a test (tests assert no timings).

@pytest.mark.slow
def test_measured_bubble_is_read_from_a_timeline():
    """The timeline of a 2-stage pipeline has every stage's work in it, once per micro-batch
    and direction, and the bubble read from it is a fraction."""
    timeline = lu.pipeline_bubble.timed_pipeline(2, 4, "1f1b", batch_size=8, n_layers=2, ms_per_sample=0.5)
    for rank, result in enumerate(timeline):
        work = sorted((s.name, s.label) for s in result["spans"]
                      if s.name in ("forward", "backward"))
        assert work == sorted((name, str(i)) for name in ("forward", "backward")
                              for i in range(4)), (rank, work)
    assert 0.0 <= lu.pipeline_bubble.measured_bubble(timeline) < 1.0


# ---- the exercise checker ----------------------------------------------------------------

def _gpipe_order(stage, n_stages, n_microbatches):
    return pl.gpipe_schedule(stage, n_stages, n_microbatches)


def _backward_first(stage, n_stages, n_microbatches):
    return list(reversed(pl.one_f_one_b_schedule(stage, n_stages, n_microbatches)))


def _one_too_many(stage, n_stages, n_microbatches):    # warm-up of p - s forwards
    return pl.one_f_one_b_schedule(stage, n_stages + 1, n_microbatches)


def _not_done(stage, n_stages, n_microbatches):
    raise NotImplementedError


def _forgot_min(stage, n_stages, n_microbatches):    # warm-up of p - s - 1 even when m is smaller
    return lab06a1._with_warmup(lambda s, p, m: p - s - 1)(stage, n_stages, n_microbatches)


def _no_drain(stage, n_stages, n_microbatches):
    ops = pl.one_f_one_b_schedule(stage, n_stages, n_microbatches)
    warmup = min(n_stages - stage - 1, n_microbatches)
    return ops[:len(ops) - warmup]                       # the drain's backwards left out


def _one_too_few(stage, n_stages, n_microbatches):     # warm-up of p - s - 2 forwards
    return pl.one_f_one_b_schedule(stage, max(stage + 1, n_stages - 1), n_microbatches)


@pytest.mark.parametrize("answer, words", [
    (_gpipe_order, "That is GPipe's order"),
    (_warmup_s, "the wrong way round"),
    (_one_too_many, "one more than 1F1B's p - s - 1"),
    (_one_too_few, "one fewer than 1F1B's p - s - 1"),
    (_forgot_min, "warm up with min(p - s - 1, m) forwards."),
    (_no_drain, "The last backwards are missing"),
])
def test_typical_mistakes_are_named_in_sentences_before_any_rank_starts(answer, words):
    failed, why = lab06a1.typical_mistake(answer)
    assert failed is None and words in why and why.endswith(".") and why[0].isupper()


def test_the_reference_and_unknown_orders_are_left_to_the_real_run():
    assert lab06a1.typical_mistake(pl.one_f_one_b_schedule) == (None, None)
    assert lab06a1.typical_mistake(_backward_first) == (None, None)
    failed, why = lab06a1.typical_mistake(_not_done)
    assert why is None and "not implemented" in failed.message


@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(pl.one_f_one_b_schedule, {
    "gpipe_order": (_gpipe_order, "That is GPipe's order: every forward before any backward."),
    "one_forward_too_many": (_one_too_many, "one more than 1F1B's p - s - 1"),
    "backward_first": (_backward_first, "before F"),
    "warmup_of_s": (_warmup_s, "so the pipeline deadlocks."),
    "not_done": (_not_done, "not implemented"),
}))
def test_check_one_f_one_b_schedule_accepts_reference_and_names_mistakes(answer, verdict):
    assert_check(lu.check_one_f_one_b_schedule, answer, verdict)
