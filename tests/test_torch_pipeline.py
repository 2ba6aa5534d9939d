"""PyTorch's ``torch.distributed.pipelining`` on the stages of ``labutils.parallel.pipeline``:
GPipe, 1F1B, interleaved 1F1B and zero bubble checked against one process and the from-scratch pipeline;
activations, messages and per-action waits counted from outside (lab 06a2)."""
import warnings
from functools import partial

import pytest
import torch

from labutils import model_parallel as mp
from labutils import pipeline as pl
from labutils import pipeline_bubble as pb
from labutils import pipeline_runs as runs_
from labutils import torch_pipeline as tp
from labutils.core.timeline import Span

pytestmark = pytest.mark.lab06a2

MODEL = partial(pl.make_pipeline_mlp, 8, 24, 16, 4)


def _batch(n=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, generator=g), torch.randn(n, 4, generator=g)


def test_interleaved_formula_reduces_to_the_plain_one():
    assert tp.interleaved_bubble(4, 8, 1) == pl.predicted_bubble(4, 8)
    assert tp.interleaved_bubble(4, 8, 2) == pytest.approx(3 / 19)
    assert tp.stage_ids("interleaved_1f1b", 1, 4) == [1, 5]
    assert tp.stage_ids("zbv", 1, 4) == [1, 6]


@pytest.mark.slow
def test_one_f_one_b_holds_fewer_activations_than_gpipe():
    x, y = torch.randn(64, 16), torch.randn(64, 4)
    runs = runs_.measure_activation_memory(MODEL, x, y, world_size=4, n_microbatches=8)
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
        theirs = runs_.run_torch_pipeline(MODEL, x, y, world_size=world_size, n_microbatches=4,
                                          steps=2)
        for schedule in ("gpipe", "1f1b"):
            ours = runs_.run_pipeline(MODEL, x, y, world_size=world_size, schedule=schedule,
                                   n_microbatches=4, steps=2)
            for key in ("grads", "params"):
                torch.testing.assert_close(mp.merge_stage_results(theirs[schedule], key),
                                           mp.merge_stage_results(ours, key))
            torch.testing.assert_close(theirs[schedule][-1]["losses"], ours[-1]["losses"])


@pytest.mark.slow
def test_every_torch_schedule_trains_like_one_process_and_runs_the_counted_order():
    """Interleaved 1F1B and both zero-bubble schedules (v = 2 stages per rank), with W emulated on
    its own path, equal one process; their own orders idle what the ideal machine counts."""
    p, m = 2, 4
    emulated = partial(pl.make_pipeline_mlp, 4, 16, 16, 4, [0.05] * 4, 0, True)
    plain = partial(pl.make_pipeline_mlp, 4, 16, 16, 4)
    x, y = _batch(8)
    runs = runs_.run_torch_pipeline(emulated, x, y, world_size=p, schedules=tuple(tp.SCHEDULES),
                                 n_microbatches=m, steps=2)
    ref = pl.reference_train(plain, x, y, steps=2)
    for schedule, per_rank in runs.items():
        for key in ("grads", "params"):
            got = mp.merge_stage_results(per_rank, key)
            extra = [n for n in got if n.endswith("emulated_weight")]
            assert len(extra) == 4 and all(got[n].item() == 0 for n in extra), schedule
            torch.testing.assert_close({n: t for n, t in got.items() if n not in extra}, ref[key])
        torch.testing.assert_close(next(r["losses"] for r in per_rank if r["losses"]), ref["losses"])
        kinds = {s.name for r in per_rank for s in r["work_spans"][-1]}
        assert kinds == {"F", "B", "W"}, (schedule, kinds)     # W ran on its own path
        if per_rank[0]["order"] is not None:    # the actions observed are the order it runs
            assert pb.action_order([r["action_spans"][-1] for r in per_rank]) == per_rank[0]["order"]
    orders = {s: runs[s][0]["order"] for s in ("interleaved_1f1b", "zero_bubble", "zbv")}
    assert pb.ideal_bubble(orders["interleaved_1f1b"]) == pytest.approx(tp.interleaved_bubble(p, m, 2))
    for schedule in ("zero_bubble", "zbv"):
        assert {k for rank in orders[schedule] for k, _, _ in rank} == {"F", "I", "W"}
        assert pb.ideal_bubble(orders[schedule]) < tp.interleaved_bubble(p, m, 2)
    assert [len(rank) for rank in orders["interleaved_1f1b"]] == [2 * 2 * m] * p   # F, B per stage


@pytest.mark.slow
def test_saved_bytes_agree_between_our_executor_and_torchs():
    x, y = _batch(16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = runs_.run_torch_pipeline(MODEL, x, y, world_size=2, n_microbatches=4, steps=2)
        for schedule in ("gpipe", "1f1b"):
            ours = runs_.observe_pipeline(MODEL, x, y, world_size=2, schedule=schedule,
                                          n_microbatches=4)
            assert [r["peak_saved_bytes"][-1] for r in theirs[schedule]] == \
                [r["peak_activation_bytes"] for r in ours], schedule
    assert all(o < g for o, g in zip(*[[r["peak_saved_bytes"][-1] for r in theirs[s]]
                                       for s in ("1f1b", "gpipe")]))


# ---- counted from outside: messages, actions and their waits --------------------------------

@pytest.mark.slow
def test_messages_are_counted_at_the_dispatcher_for_every_schedule():
    """p = 2, v = 2, m = 4: 1F1B sends one activation and one gradient per micro-batch; the looped
    schedules cross v p - 1 = 3 rank boundaries, the V 2 (stages 1 and 2 share rank 1)."""
    p, m = 2, 4
    x, y = _batch(8)
    model = partial(pl.make_pipeline_mlp, 4, 16, 16, 4)
    runs = runs_.run_torch_pipeline(model, x, y, world_size=p, schedules=tuple(tp.SCHEDULES),
                                    n_microbatches=m, steps=runs_.COUNTED_STEP + 1)
    sends = {s: [len(r["sends"]) for r in per_rank] for s, per_rank in runs.items()}
    assert sends["gpipe"] == sends["1f1b"] == [m, m]
    assert sends["interleaved_1f1b"] == sends["zero_bubble"] == [3 * m, 3 * m]
    assert sends["zbv"] == [2 * m, 2 * m]
    for s, per_rank in runs.items():     # each goes to the other rank, a micro-batch's 2 x 16 floats
        assert all(peer == 1 - rank and nbytes == 2 * 16 * 4
                   for rank, r in enumerate(per_rank) for peer, nbytes in r["sends"]), s


def _span(rank, kind, stage, mb, start, end):
    return Span(rank, kind, start, end, str((stage, mb)))


def test_action_order_and_waits_read_from_spans():
    # two stages on two ranks, one micro-batch: F on 0, F on 1 (0.5 late), B on 1, B on 0 (0.25 late)
    actions = [[_span(0, "F", 0, 0, 0.0, 1.0), _span(0, "B", 0, 0, 4.25, 6.0)],
               [_span(1, "F", 1, 0, 1.5, 2.5), _span(1, "B", 1, 0, 2.5, 4.0)]]
    work = [[Span(0, "F", 0.0, 0.9), Span(0, "B", 4.25, 5.75)],
            [Span(1, "F", 1.5, 2.5), Span(1, "B", 2.5, 4.0)]]
    assert pb.action_order(actions) == [[("F", 0, 0), ("B", 0, 0)], [("F", 1, 0), ("B", 1, 0)]]
    waits = pb.action_overheads(actions, work)
    assert sorted(waits["gaps"]) == [0.0, 0.25, 0.5]          # stage 0's first F waits for nothing
    assert sorted(waits["inside"]) == pytest.approx([0.0, 0.0, 0.1, 0.25])


def test_a_wait_per_action_adds_idle_time_and_none_adds_none():
    order = pb.stage_per_rank("1f1b", 2, 4)
    assert pb.ideal_bubble(order, overhead=0.0) == pytest.approx(pl.predicted_bubble(2, 4))
    # 2 actions per micro-batch and rank in steps of m + p - 1 slots: 3 units plus two waits
    # each, less the first action's wait, which precedes the window of work
    assert pb.ideal_bubble(order, overhead=0.5) == pytest.approx(1 - 4 * 3 / (5 * 4 - 0.5))
    assert pb.ideal_bubble(order, overhead=0.5) > pb.ideal_bubble(order)


def test_action_spans_wrap_a_stage_from_outside_and_unwrap():
    from labutils import stage_observers as obs
    from labutils.core.timeline import Timeline

    class Stage:                       # PipelineStage's three methods, nothing else
        stage_index = 3

        def forward_one_chunk(self, chunk, args, kwargs=None):
            return chunk

        def backward_one_chunk(self, chunk, loss=None, full_backward=True, last_backward=False):
            return chunk

        def backward_weight_one_chunk(self, chunk, last_backward=False):
            return chunk

    stage, tl = Stage(), Timeline(1)
    with obs.action_spans([stage], tl):
        assert stage.forward_one_chunk(0, ()) == 0
        stage.backward_one_chunk(0, loss=None, full_backward=False)
        stage.backward_weight_one_chunk(0)
        stage.backward_one_chunk(1)
    assert [(s.name, s.label) for s in tl.spans] == [("F", "(3, 0)"), ("I", "(3, 0)"),
                                                      ("W", "(3, 0)"), ("B", "(3, 1)")]
    assert "forward_one_chunk" not in vars(stage)      # the instance is as it was
