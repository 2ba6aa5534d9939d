"""Lab 05: naive model parallelism, the micro-batched forward (send vs isend) and its measured idle share, the per-stage memory formula against measured peaks, and the two checkers; each checked against one process."""
import itertools
import os
from collections import Counter
import time
import warnings
from functools import partial

import numpy
import pytest
import torch
import torch.distributed as dist

import labutils as lu
from labutils import model_parallel as mp
from labutils import model_parallel_runs as mpr
from labutils import stage_memory as sm
from labutils.exercises import lab05

from .checkers import assert_check, checker_cases

pytestmark = pytest.mark.lab05


def _batch(n=12, d_in=16, d_out=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g), torch.randn(n, d_out, generator=g)


MODEL = partial(mp.make_mlp, 6, 32, 16, 4, 0)


# ---- pure logic, no processes -----------------------------------------------------------

def test_split_sizes_even_and_errors():
    assert mp.split_sizes(8, 3) == [3, 3, 2]
    assert mp.split_sizes(4, 4) == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="cannot split a model of 4 layers into 6 stages"):
        mp.split_sizes(4, 6)
    with pytest.raises(ValueError, match="one layer count per rank"):
        mp.validate_sizes([2, 2], 4, 3)
    with pytest.raises(ValueError, match="summing to the model's 4 layers"):
        mp.validate_sizes([2, 1], 4, 2)


def test_split_model_chains_to_the_whole_model_and_keeps_names():
    model = MODEL()
    x, _ = _batch()
    stages = mp.split_model(model, 3)
    out = x
    for stage in stages:
        out = stage(out)
    torch.testing.assert_close(out, model(x))
    names = [n for s in stages for n, _ in s.named_parameters()]
    assert names == [n for n, _ in model.named_parameters()]
    assert mp.boundary_shapes(stages, x) == [(12, 16), (12, 32), (12, 32)]


def test_balanced_sizes_is_optimal_by_brute_force():
    costs = [1, 1, 1, 1, 1, 1, 4, 4]
    for n_stages in (2, 3, 4):
        best = min(max(mp.stage_costs(costs, list(sizes)))
                   for sizes in itertools.product(range(1, 8), repeat=n_stages)
                   if sum(sizes) == len(costs))
        sizes = mp.balanced_sizes(costs, n_stages)
        assert sum(sizes) == len(costs) and len(sizes) == n_stages
        assert max(mp.stage_costs(costs, sizes)) == best
    assert mp.balanced_sizes(costs, 2) == [6, 2]
    with pytest.raises(ValueError, match="into 9 stages"):
        mp.balanced_sizes(costs, 9)


def test_bad_configurations_raise_before_any_process():
    x, y = _batch()
    with pytest.raises(ValueError, match="use at most 6 stages"):
        mpr.run_naive_model_parallel(MODEL, x, y, world_size=8)
    with pytest.raises(ValueError, match="use at most 6 stages"):
        sm.stage_peaks(MODEL, x, y, world_size=8)
    with pytest.raises(ValueError, match="cannot be split evenly over 3 ranks"):
        mpr.run_split_matmul(torch.ones(2, 4), torch.ones(4, 8), world_size=3, how="column")
    with pytest.raises(ValueError, match="how must be"):
        mpr.run_split_matmul(torch.ones(2, 4), torch.ones(4, 8), how="diagonal")


# ---- real ranks ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_naive_model_parallel_equals_one_process(world_size):
    x, y = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = mpr.run_naive_model_parallel(MODEL, x, y, world_size=world_size, steps=3)
        shapes = mp.boundary_shapes(mp.split_model(MODEL(), world_size), x)
        plain = lu.launch(mp.naive_model_parallel_worker, MODEL, x, y, shapes, steps=3,
                          world_size=world_size)
    ref = mp.reference_step(MODEL, x, y, steps=3)
    for key in ("grads", "params"):       # observing from outside changes no number
        a, b = mp.merge_stage_results(plain, key), mp.merge_stage_results(results, key)
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a), key
    assert plain[-1]["losses"] == results[-1]["losses"]
    torch.testing.assert_close(plain[-1]["output"], ref["output"])
    torch.testing.assert_close(results[-1]["output"], ref["output"])
    torch.testing.assert_close(results[-1]["losses"], ref["losses"])
    grads = mp.merge_stage_results(results, "grads")
    assert set(grads) == set(ref["grads"])                # every gradient, each on one rank
    torch.testing.assert_close(grads, ref["grads"])
    torch.testing.assert_close(mp.merge_stage_results(results, "params"), ref["params"])
    # naive model parallelism: ranks take turns, so each is idle most of the step
    assert all(r["output"] is None for r in results[:-1])
    assert lu.timeline.bubble_fraction(lu.timeline.flatten([r["spans"] for r in results])) > 0


@pytest.mark.slow
def test_memory_per_rank_falls_below_the_single_process_peak():
    model_fn = partial(mp.make_mlp, 8, 128, 64, 10, 0)
    x, y = _batch(64, 64, 10)
    single = sm.single_process_peak(model_fn, x, y)
    assert single == sm.single_process_peak(model_fn, x, y)   # measured bytes reproduce
    peaks = {ws: sm.stage_peaks(model_fn, x, y, world_size=ws) for ws in (2, 4)}
    assert max(peaks[2]) < single and max(peaks[4]) < max(peaks[2])
    # each rank holds at least its own weights and their gradients
    for ws, per_rank in peaks.items():
        stages = mp.split_model(model_fn(), ws)
        for stage, peak in zip(stages, per_rank):
            assert peak >= 2 * sm.weight_bytes(stage)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_split_matmuls_equal_the_full_matmul(world_size):
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(5, 8, generator=g), torch.randn(8, 12, generator=g)
    for how in ("column", "row"):
        for y in mpr.run_split_matmul(x, w, world_size=world_size, how=how):
            torch.testing.assert_close(y, x @ w)


def _microbatched(rank, world_size, x, n_microbatches, blocking):
    stages = mp.split_model(MODEL(), world_size)
    x_mbs = x.chunk(n_microbatches)
    in_shape = mp.boundary_shapes(stages, x_mbs[0])[rank]
    return lu.microbatch.microbatched_forward(rank, world_size, stages[rank], x_mbs, in_shape,
                                              blocking=blocking)


def _timed(rank, world_size, x, n_microbatches, blocking):
    return lu.microbatch_idle.timed_forward(rank, world_size, mp.split_model(MODEL(), world_size),
                                            x, n_microbatches, blocking)


@pytest.mark.slow
@pytest.mark.parametrize("blocking", [False, True])
def test_microbatched_forward_equals_the_whole_batch(blocking):
    x, _ = _batch()
    results = lu.launch(_microbatched, x, 4, blocking, world_size=3, timeout=60,
                        warn_oversubscription=False)
    with torch.no_grad():
        torch.testing.assert_close(results[-1], MODEL()(x))
    assert all(out is None for out in results[:-1])
    timed = lu.launch(_timed, x, 4, blocking, world_size=3, timeout=60,
                      warn_oversubscription=False)
    assert torch.equal(timed[-1][0], results[-1])
    assert [[s.label for s in spans] for _, spans in timed] == [["0", "1", "2", "3"]] * 3


def test_unequal_microbatches_are_refused():
    with pytest.raises(ValueError, match=r"cannot be split into 5 equal micro-batches: use one of \[1, 2, 3, 4, 6, 12\]"):
        lu.microbatch.validate_microbatches(12, 5)


def _handoff(rank, world_size, blocking, marker, returned):
    """Rank 1 posts its recv only after rank 0's hand-off returned (isend) or after writing the
    marker (send); rank 0 reports whether the marker existed when its hand-off returned."""
    t = torch.zeros(4, 8)
    if rank == 1:
        if not blocking:
            while not os.path.exists(returned):     # isend must return without our recv
                time.sleep(0.01)
        open(marker, "w").close()                   # about to post the recv
        dist.recv(t, src=0)
        return None
    if blocking:
        dist.send(t, dst=1)
        return os.path.exists(marker)
    work = dist.isend(t, dst=1)
    seen = os.path.exists(marker)
    open(returned, "w").close()
    work.wait()
    return seen


@pytest.mark.slow
def test_gloo_send_waits_for_the_recv_and_isend_does_not(tmp_path):
    for blocking in (True, False):
        marker, returned = tmp_path / f"posted{blocking}", tmp_path / f"returned{blocking}"
        seen = lu.launch(_handoff, blocking, str(marker), str(returned), world_size=2,
                         timeout=30)[0]
        # send returns only after the receiver is at its recv; isend returns before it is
        assert seen is blocking


@pytest.mark.slow
def test_microbatch_idle_measure_reports_every_variant():
    model_fn = partial(lu.pipeline.make_pipeline_mlp, 4, 8, 16, 4, [0.05] * 4)
    x, _ = _batch(8)
    rows = lu.microbatch_idle.measure(model_fn, x, world_size=2, variants=((1, False), (4, True)),
                                      repeats=2, rounds=3)
    for v in ((1, False), (4, True)):
        with torch.no_grad():
            torch.testing.assert_close(rows[v]["output"], model_fn()(x))
        assert rows[v]["idle"].n == 2 and 0 <= rows[v]["idle"].min <= rows[v]["idle"].max < 1
        assert rows[v]["formula"] == (2 - 1) / (v[0] + 2 - 1)
        assert len(rows[v]["spans"]) == 2 * v[0]          # one span per micro-batch per rank
    assert rows["hop"].n == 3
    one_rank = lu.microbatch_idle.measure(model_fn, x, world_size=1, variants=((2, False),),
                                          repeats=1, rounds=3)
    assert one_rank["hop"] is None and len(one_rank[(2, False)]["spans"]) == 2   # no ping-pong
    with torch.no_grad():
        torch.testing.assert_close(one_rank[(2, False)]["output"], model_fn()(x))


# ---- the memory formula of this lab (gradients fresh) against the measured peak -----------

def test_fresh_formula_matches_one_process_peak():
    model_fn = partial(mp.make_mlp, 8, 128, 64, 10, 0)
    x, y = _batch(64, 64, 10)
    est = lu.memory.model_memory(model_fn(), optimizer="sgd", example_input=x, gradients="fresh")
    assert est["total"] == sum(est[t] for t in lu.memory.TERMS)
    assert est["weights"] == sm.weight_bytes(model_fn()) and est["optimizer"] == 0
    peak = sm.single_process_peak(model_fn, x, y)
    assert abs(peak / est["total"] - 1) < 0.05
    kept = lu.memory.model_memory(model_fn(), optimizer="sgd", example_input=x)
    assert est["total"] < kept["total"]                  # gradients and activations never all coexist
    with pytest.raises(ValueError, match="'kept' or 'fresh'"):
        lu.memory.model_memory(model_fn(), gradients="sometimes")


@pytest.mark.slow
def test_stage_formulas_match_each_ranks_measured_peak():
    model_fn = partial(mp.make_mlp, 8, 128, 64, 10, 0)
    x, y = _batch(64, 64, 10)
    rows = lu.stage_memory.formula_vs_measured(model_fn, x, y, world_sizes=(1, 2, 4))
    assert [len(r) for r in rows.values()] == [1, 2, 4]
    for per_rank in rows.values():
        for est, peak in per_rank:
            assert abs(peak / est["total"] - 1) < 0.05, (est, peak)


@pytest.mark.slow
def test_naive_model_parallel_counts_two_messages_per_boundary_and_keeps_step_spans():
    x, y = _batch()
    results = mpr.run_naive_model_parallel(MODEL, x, y, world_size=3, steps=2,
                                           warn_oversubscription=False)
    counted = [Counter(c.op for c in r["messages"]) for r in results]
    assert [c["send"] for c in counted] == [1, 2, 1] and [c["recv_"] for c in counted] == [1, 2, 1]
    # forward: an activation to rank + 1; backward: its gradient to rank - 1, each 12 x width
    shapes = mp.boundary_shapes(mp.split_model(MODEL(), 3), x)
    for rank, r in enumerate(results):
        sends = [(c.peer, c.nbytes) for c in r["messages"] if c.op == "send"]
        expected = ([(rank + 1, torch.empty(shapes[rank + 1]).nbytes)] if rank < 2 else []) + \
            ([(rank - 1, torch.empty(shapes[rank]).nbytes)] if rank > 0 else [])
        assert sends == expected, rank
    for r in results:
        assert len(r["step_spans"]) == 2
        assert [[s.name for s in step] for step in r["step_spans"]] == [["forward", "backward"]] * 2
    # a chain: each stage computes only after its neighbour's message arrived, so the spans of
    # neighbours never overlap (the backward span ends before its gradient is sent); the clock
    # (perf_counter, CLOCK_MONOTONIC) is one for every process on Linux
    for step in range(2):
        spans = [{s.name: s for s in r["step_spans"][step]} for r in results]
        for k in range(len(results) - 1):
            assert spans[k]["forward"].end <= spans[k + 1]["forward"].start
            assert spans[k + 1]["backward"].end <= spans[k]["backward"].start


# ---- the exercise checker ----------------------------------------------------------------

def _forgets_to_send(rank, world_size, stage_input, stage_output, loss):
    if rank == world_size - 1:
        loss.backward()
    else:
        grad_output = torch.empty_like(stage_output)
        dist.recv(grad_output, src=rank + 1)
        stage_output.backward(grad_output)


def _sends_zeros(rank, world_size, stage_input, stage_output, loss):
    _forgets_to_send(rank, world_size, stage_input, stage_output, loss)
    if rank > 0:
        dist.send(torch.zeros_like(stage_input), dst=rank - 1)


def _not_done(rank, world_size, stage_input, stage_output, loss):
    raise NotImplementedError


@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(mp.naive_backward, {
    "sends_zeros": (_sends_zeros, ("rank 0", "expected", "got 0.0")),
    "forgets_to_send": (_forgets_to_send, ("deadlock", "rank 0 waiting in dist.recv"),
                        {"timeout": 8}),
    "not_done": (_not_done, "not implemented"),
}))
def test_check_naive_backward_accepts_reference_and_names_mistakes(answer, verdict):
    assert_check(lu.check_naive_backward, answer, verdict)


def _off_by_one(p, max_idle):             # stops where the share equals the target (<=)
    m = 1
    while (p - 1) / (m + p - 1) > max_idle:
        m += 1
    return m


def _p_not_p_minus_1(p, max_idle):
    m = 1
    while p / (m + p) >= max_idle:
        m += 1
    return m


def _forgets_fill(p, max_idle):           # (p-1)/m
    m = 1
    while (p - 1) / m >= max_idle:
        m += 1
    return m


def _returns_the_share(p, max_idle):
    return (p - 1) / (lab05.min_microbatches(p, max_idle) + p - 1)


def _one_too_many(p, max_idle):
    return lab05.min_microbatches(p, max_idle) + 1


def _closed_form(p, max_idle):            # also right: floor((p-1)/t - (p-1)) + 1, where exact
    m = int((p - 1) / max_idle - (p - 1)) + 1
    return m - 1 if (p - 1) / (m - 1 + p - 1) < max_idle else m


def _numpy_int(p, max_idle):             # also right: an integer that is not a Python int
    return numpy.int64(lab05.min_microbatches(p, max_idle))


def _stub(p, max_idle):
    raise NotImplementedError


@pytest.mark.parametrize("answer, verdict", checker_cases(lab05.min_microbatches, {
    "off_by_one": (_off_by_one, ("expected 28, got 27", "equals the target", "<=")),
    "p_not_p_minus_1": (_p_not_p_minus_1, ("got 37", "(p-1)/(m+p-1)", "not p")),
    "forgets_fill": (_forgets_fill, ("got 31", "m+p-1")),
    "returns_the_share": (_returns_the_share, "looks like an idle share"),
    "one_too_many": (_one_too_many, ("got 29", "smallest")),
    "stub": (_stub, "not implemented"),
}, passes="5 cases passed", also_right={"closed_form": _closed_form, "numpy_int": _numpy_int}))
def test_check_min_microbatches_accepts_reference_and_names_mistakes(answer, verdict):
    assert_check(lu.check_min_microbatches, answer, verdict)
