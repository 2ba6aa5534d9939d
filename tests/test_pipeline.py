"""labutils.parallel.pipeline: GPipe and 1F1B from send/recv, checked against one process (lab 06a)."""
import warnings
from functools import partial

import pytest
import torch

import labutils as lu
from labutils import model_parallel as mp
from labutils import pipeline as pl

from .checkers import assert_check, checker_cases

pytestmark = pytest.mark.lab06a

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
    text = lambda ops: " ".join(f"{o}{i}" for o, i in ops)  # noqa: E731
    assert text(pl.one_f_one_b_schedule(0, 4, 5)) == "F0 F1 F2 F3 B0 F4 B1 B2 B3 B4"
    assert text(pl.one_f_one_b_schedule(2, 4, 5)) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4"
    assert text(pl.one_f_one_b_schedule(3, 4, 3)) == "F0 B0 F1 B1 F2 B2"


def test_schedule_problem_names_the_mistake():
    assert pl.schedule_problem([("B", 0), ("F", 0)], 1) == "B0 before F0"
    assert pl.schedule_problem([("F", 0)], 1) == "B0 appears 0 times"


def test_received_before_releases_only_gradients_already_taken():
    prev = pl.one_f_one_b_schedule(0, 2, 3)            # F0 F1 B0 F2 B1 B2
    assert pl.received_before(prev) == {0: set(), 1: set(), 2: {0}}


def test_bad_configurations_raise_before_any_process():
    x, y = _batch(24)
    with pytest.raises(ValueError, match="cannot be split into 5 equal micro-batches"):
        pl.run_pipeline(MODEL, x, y, world_size=2, n_microbatches=5)
    with pytest.raises(ValueError, match="cannot split a model of 8 layers into 9 stages"):
        pl.run_pipeline(MODEL, x, y, world_size=9, n_microbatches=4)
    with pytest.raises(ValueError, match="unknown schedule"):
        pl.run_pipeline(MODEL, x, y, schedule="zigzag")
    with pytest.raises(ValueError, match="cannot be split into 7"):
        lu.torch_pipeline.run_torch_pipeline(MODEL, x, y, n_microbatches=7)
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
        results = pl.run_pipeline(MODEL, x, y, world_size=world_size, schedule=schedule,
                                  n_microbatches=m, steps=3)
    ref = pl.reference_train(MODEL, x, y, steps=3)
    torch.testing.assert_close(results[-1]["losses"], ref["losses"])
    grads = mp.merge_stage_results(results, "grads")
    assert set(grads) == set(ref["grads"])
    torch.testing.assert_close(grads, ref["grads"])
    torch.testing.assert_close(mp.merge_stage_results(results, "params"), ref["params"])
    spans = [s for r in results for s in r["spans"]]
    assert sum(s.name == "forward" for s in spans) == world_size * m


@pytest.mark.slow
def test_one_f_one_b_holds_fewer_activations_than_gpipe():
    x, y = torch.randn(64, 16), torch.randn(64, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = {s: pl.run_pipeline(MODEL, x, y, world_size=4, schedule=s, n_microbatches=8,
                                   measure_memory=True) for s in ("gpipe", "1f1b")}
    assert [r["peak_microbatches"] for r in runs["gpipe"]] == [8, 8, 8, 8]
    assert [r["peak_microbatches"] for r in runs["1f1b"]] == [4, 3, 2, 1]
    for g, o in zip(runs["gpipe"], runs["1f1b"]):
        assert o["peak_activation_bytes"] < g["peak_activation_bytes"]
        assert o["peak_bytes"] < g["peak_bytes"]          # measured by lu.memory.measure_peak
    # GPipe keeps the whole batch's activations; 1F1B on stage s keeps (p - s) / m of them
    for s, (g, o) in enumerate(zip(runs["gpipe"], runs["1f1b"])):
        assert o["peak_activation_bytes"] * 8 == g["peak_activation_bytes"] * (4 - s)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_torch_pipelining_matches_the_from_scratch_pipeline(world_size):
    x, y = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = lu.torch_pipeline.run_torch_pipeline(MODEL, x, y, world_size=world_size, n_microbatches=4,
                                       steps=2)
        for schedule in ("gpipe", "1f1b"):
            ours = pl.run_pipeline(MODEL, x, y, world_size=world_size, schedule=schedule,
                                   n_microbatches=4, steps=2)
            for key in ("grads", "params"):
                torch.testing.assert_close(mp.merge_stage_results(theirs[schedule], key),
                                           mp.merge_stage_results(ours, key))
            torch.testing.assert_close(theirs[schedule][-1]["losses"], ours[-1]["losses"])


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


def _not_done(stage, n_stages, n_microbatches):
    raise NotImplementedError


@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(pl.one_f_one_b_schedule, {
    "gpipe_order": (_gpipe_order, ("'order'", "expected 'B0'")),
    "backward_first": (_backward_first, "before F"),
    "not_done": (_not_done, "not implemented"),
}))
def test_check_one_f_one_b_schedule_accepts_reference_and_names_mistakes(answer, verdict):
    assert_check(lu.check_one_f_one_b_schedule, answer, verdict)
