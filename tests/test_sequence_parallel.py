"""Megatron sequence parallelism (labutils.parallel.sequence_parallel, lab 06d1): the pre-LN layer
with dropout equal to one process (outputs and every gradient) at t = 2, 3, 4; the collectives
counted at the dispatcher (the buffer handed to each call) and the ring model's bytes derived
from them equal to tensor parallelism alone's; the activation bytes
saved for backward equal to the adapted Korthikanti formula; bad splits refused before launch."""
import pytest
import torch

import labutils as lu
from labutils import sequence_parallel as sp
from labutils import sp_equivalence as se
from labutils import sp_memory as sm

pytestmark = pytest.mark.lab06d1


# ---- pure logic, no processes -------------------------------------------------------------

def test_uneven_sequence_is_refused_before_any_process_starts(monkeypatch):
    def no_launch(*a, **k):
        raise AssertionError("a process was started for a bad configuration")
    monkeypatch.setattr(lu.sp_equivalence, "launch", no_launch)
    monkeypatch.setattr(lu.sp_memory, "launch", no_launch)
    with pytest.raises(ValueError, match=r"sequence length 50 is not divisible by the "
                                         r"tensor-parallel size 4.*\[1, 2, 5\]"):
        se.run_sp_check(4, seq=50)
    with pytest.raises(ValueError, match="hidden size 48 is not divisible by the "
                                         "tensor-parallel size 5"):
        sm.run_memory((5,), seq=50)


def test_dropout_shards_are_slices_of_the_full_mask():
    x = torch.ones(2, 12, 8)
    full = sp.seeded_dropout(x, 0.5, seed=3, full_shape=x.shape)
    shards = [sp.seeded_dropout(x[:, i:i + 4], 0.5, 3, x.shape, start=i) for i in (0, 4, 8)]
    torch.testing.assert_close(torch.cat(shards, dim=1), full)
    # a mask drawn for the shard's shape alone would repeat positions 0..3 on every rank
    assert not torch.equal(shards[1], shards[0])
    assert set(full.unique().tolist()) == {0.0, 2.0}


def test_tensor_parallel_baseline_on_one_rank_is_the_reference():
    ref, x, _ = se.reference_and_inputs(2, 8, 16, 4, 0.2, 1)
    layer = sp.SequenceParallelTransformerLayer(ref, lu.tensor_parallel.TPLayout(0, 1),
                                                sequence_parallel=False)
    torch.testing.assert_close(layer(x), ref(x))


def test_formula_adaptation_terms():
    f1, f2 = sm.formula(2, False), sm.formula(2, True)
    sbh = 2 * 48 * 48
    assert f1["paper"] == (10 + 24 / 2) * sbh and f2["paper"] == (10 + 24) / 2 * sbh
    assert f1["adapted"] == 2 * f1["paper"] - 2 * sbh
    assert f2["adapted"] == 2 * f2["paper"] - sbh + 4 * sbh
    assert sm.sp_saving(4) == 0.75 * (10 * sbh + 16 * 2 * 48)
    # Megatron's re-gather would also split the QKV and fc1 inputs (4 bytes each, float32)
    assert sm.sp_saving(4, regather=True) - sm.sp_saving(4) == 0.75 * 8 * sbh


def test_ring_model_bytes_are_derived_from_payloads():
    # the cost layer's ring: all-reduce 2(t-1)/t of its buffer; reduce-scatter and all-gather
    # (t-1)/t of the unsharded buffer, whichever side of the call it is on
    assert se.ring_model_bytes("allreduce_", 800, 800, 4) == 1200
    assert se.ring_model_bytes("reduce_scatter_", 800, 200, 4) == 600
    assert se.ring_model_bytes("allgather_", 200, 800, 4) == 600


# ---- real ranks ----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("t", [2, 3, 4])
def test_sequence_parallel_layer_equals_one_process(t):
    res = se.run_sp_check(t, sequence_parallel=True)   # asserts every output and gradient
    sbh = 2 * 48 * 48 * 8   # one (B, T, H) float64 activation, in bytes
    for phase in ("forward", "backward"):
        # counted at the dispatcher: 2 reduce-scatters of sbh in / sbh/t out, 2 all-gathers
        # sbh/t -> sbh
        assert sorted(res["calls"][phase]) == sorted(
            2 * [("allgather_", sbh // t, sbh), ("reduce_scatter_", sbh, sbh // t)])
    # the replicated LayerNorm weights/biases and row biases: one all-reduce of 6 H values
    assert res["calls"]["grads"] == [("allreduce_", 6 * 48 * 8, 6 * 48 * 8)]


@pytest.mark.slow
@pytest.mark.parametrize("t", [2, 4])
def test_tensor_parallel_payloads_and_the_ring_model(t):
    tp_res = se.run_sp_check(t, sequence_parallel=False)
    sp_res = se.run_sp_check(t, sequence_parallel=True)
    sbh = 2 * 48 * 48 * 8
    for phase in ("forward", "backward"):
        assert tp_res["calls"][phase] == 2 * [("allreduce_", sbh, sbh)]   # g, g; f, f
        # derived, not measured: the ring model gives both layouts the cost layer's figure
        model = {lay: sum(r[5] for r in se.comm_table(res, t) if r[0] == phase)
                 for lay, res in (("TP", tp_res), ("TP+SP", sp_res))}
        assert model["TP"] == model["TP+SP"] == lu.long_context.sequence_parallel_bytes(
            48, 2, 48, t, 8, phase)
    assert tp_res["calls"]["grads"] == []


@pytest.mark.slow
@pytest.mark.parametrize("t", [2, 3])
def test_megatron_regather_equals_one_process_with_two_more_backward_all_gathers(t):
    res = se.run_sp_check(t, regather=True)   # asserts every output and gradient
    plain = se.run_sp_check(t)
    sbh = 2 * 48 * 48 * 8
    assert res["calls"]["forward"] == plain["calls"]["forward"]
    assert sorted(res["calls"]["backward"]) == sorted(
        plain["calls"]["backward"] + 2 * [("allgather_", sbh // t, sbh)])


@pytest.mark.slow
def test_activation_bytes_match_the_adapted_formula():
    rows = sm.run_memory((2, 4))   # asserts measured == formula and the LN/dropout saving
    by = {(r["t"], r["layout"]): r for r in rows}
    for t in (2, 4):
        assert (by[(t, "TP+SP re-gather")]["measured"] < by[(t, "TP+SP")]["measured"]
                < by[(t, "TP")]["measured"])
        assert 1.0 < by[(t, "TP")]["ratio"] < 1.03



@pytest.mark.slow
@pytest.mark.parametrize("t", [2, 3])
def test_seq_first_layout_equals_one_process(t):
    """Megatron's (s, b, h) layout: output, input gradient and every parameter gradient equal
    the single-process layer (asserted inside run_sp_check); its collectives are the
    single-tensor ones, the same payloads as the (b, s, h) layout's list calls."""
    res = se.run_sp_check(t, seq_first=True)
    assert res["grads_checked"] == 12
    sbh = 2 * 48 * 48 * 8
    for phase in ("forward", "backward"):
        assert sorted(res["calls"][phase]) == sorted(
            2 * [("_allgather_base_", sbh // t, sbh), ("_reduce_scatter_base_", sbh, sbh // t)])


def test_seq_first_needs_plain_sequence_parallelism():
    ref = sp.PreLNTransformerLayer(48, 12)
    with pytest.raises(ValueError, match="sequence_parallel=True and regather=False"):
        sp.SequenceParallelTransformerLayer(ref, None, sequence_parallel=False, seq_first=True)
