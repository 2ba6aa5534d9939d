"""Ring attention (labutils.parallel.online_softmax, ring_attention; experiments.ring_timing;
lab 06d2): block attention and the online-softmax merge equal to PyTorch's attention; the
layouts' positions; the ring on 2, 3 and 4 real ranks equal to one process (output and every
gradient, contiguous and zig-zag); the counted work equal to its formula; the measurement's
shape (no timed assertions); the merge checker against typical mistakes."""
import pytest
import torch
import torch.nn.functional as F

import labutils as lu
from labutils.core.timeline import Span
from labutils.exercises import lab06d2
from labutils.experiments import ring_timing as rt
from labutils.experiments import ring_trace
from labutils.parallel import online_softmax as osm
from labutils.parallel import ring_attention as ra

from .checkers import assert_check, checker_cases

pytestmark = pytest.mark.lab06d2


# ---- pure logic, no processes -------------------------------------------------------------

def test_block_attention_over_the_whole_sequence_is_pytorchs():
    q, k, v, _ = ra.qkv(24)
    pos = torch.arange(24)
    out, lse = osm.block_attention(q, k, v, osm.causal_mask(pos, pos))
    torch.testing.assert_close(out, ra.reference_attention(q, k, v))
    scores = (q @ k.transpose(-2, -1) / 4.0).masked_fill(~osm.causal_mask(pos, pos), -torch.inf)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))


@pytest.mark.parametrize("cut", [1, 7, 12, 23])
def test_merged_blocks_equal_attention_over_all_keys(cut):
    q, k, v, _ = ra.qkv(24)
    pos = torch.arange(24)
    a, b = slice(0, cut), slice(cut, 24)
    mask = osm.causal_mask(pos, pos)
    out_a, lse_a = osm.block_attention(q, k[..., a, :], v[..., a, :], mask[:, a])
    out_b, lse_b = osm.block_attention(q, k[..., b, :], v[..., b, :], mask[:, b])
    assert torch.isinf(lse_b[..., :cut]).all()            # rows that see none of block b
    out, lse = osm.merge_attention_blocks(out_a, lse_a, out_b, lse_b)
    want_out, want_lse = osm.block_attention(q, k, v, mask)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)


def test_merge_is_finite_with_logits_that_overflow_exp():
    lse_a, lse_b = torch.tensor([3000.0, 10.0]), torch.tensor([10.0, 3000.0])
    out_a, out_b = torch.ones(2, 3), torch.full((2, 3), 2.0)
    out, lse = osm.merge_attention_blocks(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(out, torch.tensor([[1.0] * 3, [2.0] * 3]))
    torch.testing.assert_close(lse, torch.tensor([3000.0, 3000.0]))


def test_block_backward_summed_over_blocks_is_autograd():
    q, k, v, dout = ra.qkv(16, heads=2, head_dim=8)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    out = ra.reference_attention(*full)
    out.backward(dout)
    pos = torch.arange(16)
    _, lse = osm.block_attention(q, k, v, osm.causal_mask(pos, pos))
    delta = (dout * out.detach()).sum(-1)
    grads = [torch.zeros_like(t) for t in (q, k, v)]
    for ks in (slice(0, 5), slice(5, 16)):
        dq, dk, dv = osm.block_attention_backward(q, k[..., ks, :], v[..., ks, :],
                                                  osm.causal_mask(pos, pos[ks]), lse, dout, delta)
        grads[0] += dq
        grads[1][..., ks, :] += dk
        grads[2][..., ks, :] += dv
    for got, t in zip(grads, full):
        torch.testing.assert_close(got, t.grad)


@pytest.mark.parametrize("kind, world_size, rank_1_chunks", [
    ("contiguous", 4, [range(6, 12)]),
    ("zigzag", 4, [range(3, 6), range(18, 21)]),
])
def test_layout_positions(kind, world_size, rank_1_chunks):
    layout = ra.RingLayout(24, world_size, kind)
    assert layout.chunks(1) == rank_1_chunks
    everything = torch.cat([layout.positions(r) for r in range(world_size)])
    assert sorted(everything.tolist()) == list(range(24))     # every position once
    x = torch.arange(24.0).view(1, 1, 24, 1)
    torch.testing.assert_close(layout.unshard([layout.shard(x, r) for r in range(world_size)]), x)


def test_zigzag_rank_r_holds_chunks_r_and_2n_minus_1_minus_r():
    layout = ra.RingLayout(48, 3, "zigzag")
    assert [[r.start // 8 for r in layout.chunks(rank)] for rank in range(3)] == \
        [[0, 5], [1, 4], [2, 3]]


@pytest.mark.parametrize("seq, world_size, kind, words", [
    (50, 4, "contiguous", "cannot be cut into 4 equal chunks"),
    (36, 4, "zigzag", r"cannot be cut into 8 equal chunks \(zigzag on 4 ranks\)"),
    (24, 2, "striped", "layout must be one of"),
])
def test_bad_split_is_refused_before_any_process_starts(monkeypatch, seq, world_size, kind, words):
    def no_launch(*a, **k):
        raise AssertionError("a process was started for a bad configuration")
    monkeypatch.setattr(rt, "launch", no_launch)
    with pytest.raises(ValueError, match=words):
        rt.run(world_size, seq=seq) if kind != "striped" else ra.RingLayout(seq, world_size, kind)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ra.LAYOUTS)
def test_counted_work_is_the_formula(world_size, kind):
    """The work the ring does (attend_chunks as each rank calls it, observed from outside by
    ring_trace, pairs counted from the masks of the chunks it was given) against the formulas."""
    seq = 48
    layout = ra.RingLayout(seq, world_size, kind)
    q = torch.zeros(1, 1, seq // world_size, 2)
    for rank in range(world_size):
        with ring_trace.trace_ring(layout) as trace:
            for src in range(world_size):
                ra.attend_chunks(q, q, q, layout.chunks(rank), layout.chunks(src))
        assert [e.label for e in trace.spans("compute")] == [str(s) for s in range(world_size)]
        assert trace.pairs["pairs"] == rt.pairs_formula(seq, world_size, kind, rank)
        assert trace.pairs["blocks"] == rt.blocks_formula(world_size, kind, rank)
    total = sum(rt.pairs_formula(seq, world_size, kind, r) for r in range(world_size))
    assert total == seq * (seq + 1) // 2                      # the causal triangle, once


def test_one_process_ring_emulation_equals_reference():
    """The ring's per-rank loop, run for every rank in one process: no collectives involved."""
    q, k, v, _ = ra.qkv(48)
    for kind in ra.LAYOUTS:
        layout = ra.RingLayout(48, 3, kind)
        outs = []
        for r in range(3):
            out = lse = None
            for step in range(3):
                src = (r - step) % 3
                o, lo = osm.attend_chunks(layout.shard(q, r), layout.shard(k, src),
                                          layout.shard(v, src), layout.chunks(r),
                                          layout.chunks(src))
                out, lse = (o, lo) if out is None else osm.merge_attention_blocks(out, lse, o, lo)
            outs.append(out)
        torch.testing.assert_close(layout.unshard(outs), ra.reference_attention(q, k, v))


class _NoNetwork:
    """Stands in for torch.distributed in one process: every request is done at once and an
    incoming block is zeros. The schedule (what is posted, computed, waited for) is the ring's."""
    class _Done:
        def wait(self):
            return True

    def irecv(self, buf, src, tag):
        buf.zero_()
        return self._Done()

    def isend(self, t, dst, tag):
        return self._Done()


def _forward_order(n, overlap):
    hop = ["post K/V", "compute", "wait K/V"] if overlap else ["compute", "post K/V", "wait K/V"]
    return hop * (n - 1) + ["compute"]


def _backward_order(n):
    """Post the K/V hop, compute, THEN wait for the dK/dV accumulator posted one step earlier
    (so it flew during this block's compute), wait for K/V, post the accumulator on."""
    order = []
    for s in range(n):
        order += ["post K/V"] if s < n - 1 else []
        order += ["compute"]
        order += ["wait dK/dV"] if s > 0 else []
        order += ["wait K/V"] if s < n - 1 else []
        order += ["post dK/dV"]
    return order + ["wait dK/dV"]


def _expected_sends(seq, n, heads=4, head_dim=16, element=8):
    """N-1 K/V sends forward; N-1 K/V and N dK/dV sends backward; bytes = long_context's."""
    block = 2 * seq // n * heads * head_dim * element
    sends = {"forward": {"K/V": {"calls": n - 1, "bytes": (n - 1) * block}},
             "backward": {"K/V": {"calls": n - 1, "bytes": (n - 1) * block},
                          "dK/dV": {"calls": n, "bytes": n * block}}}
    for phase in ("forward", "backward"):
        assert sum(c["bytes"] for c in sends[phase].values()) == \
            lu.long_context.ring_kv_bytes(seq, 1, heads * head_dim, n, element, phase)
    return sends


@pytest.mark.parametrize("overlap", [True, False])
def test_forward_posts_the_hop_before_computing(monkeypatch, overlap):
    monkeypatch.setattr(ra, "dist", _NoNetwork())
    layout = ra.RingLayout(48, 3, "zigzag")
    q, k, v, _ = (layout.shard(t, 1) for t in ra.qkv(48))
    with ring_trace.trace_ring() as trace:
        ra.ring_attention_forward(q, k, v, layout, 1, overlap=overlap)
    assert trace.order() == _forward_order(3, overlap)
    assert len(trace.flights("K/V")) == 2


def test_backward_waits_for_dkdv_only_after_the_next_block(monkeypatch):
    monkeypatch.setattr(ra, "dist", _NoNetwork())
    layout = ra.RingLayout(48, 4, "contiguous")
    q, k, v, dout = (layout.shard(t, 2).requires_grad_() for t in ra.qkv(48))
    out = ra.ring_attention(q, k, v, layout, 2)
    with ring_trace.trace_ring() as trace:
        out.backward(dout.detach())
    assert trace.order() == _backward_order(4)


def test_the_trace_leaves_the_ring_as_it_found_it():
    real = (ra.ring_shift, ra.wait, ra.attend_chunks, ra.attend_chunks_backward)
    with ring_trace.trace_ring():
        assert ra.wait is not real[1]
    assert (ra.ring_shift, ra.wait, ra.attend_chunks, ra.attend_chunks_backward) == real


def test_one_rank_ring_sends_nothing():
    q, k, v, dout = (t.requires_grad_() for t in ra.qkv(16))
    with ring_trace.trace_ring() as trace:
        out = ra.ring_attention(q, k, v, ra.RingLayout(16, 1), 0)
        out.backward(dout.detach())
    torch.testing.assert_close(out, ra.reference_attention(q, k, v))
    assert trace.order() == ["compute", "compute"]     # no post, no wait


def test_overlap_share_counts_flight_covered_by_compute():
    spans = [Span(0, "compute block", 0.0, 2.0), Span(0, "wait for K/V", 2.0, 3.0),
             Span(0, "compute block", 3.0, 4.0)]
    covered, flight = rt.overlap_share(spans, [(0.5, 3.0), (3.0, 3.5)])
    assert (covered, flight) == (2.0, 3.0)


# ---- real ranks ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("kind", ra.LAYOUTS)
def test_ring_attention_equals_one_process(world_size, kind):
    """Output and the gradients of q, k and v on every rank, float64, default tolerances; the
    sends each rank issued (a ring, not an all-gather or all-reduce) and their order."""
    per_rank = lu.launch(ring_trace.equality_worker, 48, kind, world_size=world_size,
                         warn_oversubscription=False)
    for rank, (ring, ref, observed) in enumerate(per_rank):
        assert set(ring) == {"out", "dq", "dk", "dv"}
        for name in ring:
            torch.testing.assert_close(ring[name], ref[name], msg=name)
        # counted at the dispatcher: point-to-point only, one send and one receive per hop
        expected = _expected_sends(48, world_size)
        for phase in ("forward", "backward"):
            assert observed[phase]["sends"] == expected[phase]
            hops = sum(c["calls"] for c in expected[phase].values())
            assert observed[phase]["ops"] == {"send": hops, "recv_": hops}
        assert observed["forward"]["order"] == _forward_order(world_size, True)
        assert observed["backward"]["order"] == _backward_order(world_size)


@pytest.mark.slow
def test_measurement_shape_and_counts():
    result = rt.run(2, seq=64, repeats=2)
    assert set(result) == set(rt.VARIANTS)
    for name, (kind, _, _) in rt.VARIANTS.items():
        r = result[name]
        assert r["pairs"] == [rt.pairs_formula(64, 2, kind, rank) for rank in range(2)]
        assert r["blocks"] == [rt.blocks_formula(2, kind, rank) for rank in range(2)]
        assert [s.n for s in r["compute"]] == [2, 2]
        assert r["step"].n == 2
        assert r["step"].min >= max(t.min for t in r["compute"])   # a step includes its compute
        assert 0.0 <= r["overlap"].min <= r["overlap"].max <= 1.0
        assert r["hops"].n == r["wait"].n == 2 and 0.0 <= r["wait"].min
        assert r["hops"].max <= r["step"].max                      # hops lie inside the step
        assert {s.name for s in r["spans"]} == {"compute block", "wait for K/V"}
        assert sum(s.name == "compute block" for s in r["spans"]) == 2 * 2   # N blocks, N ranks
    assert "rank" in rt.slowest_words(result["zigzag"]["compute"])
    per_round = rt.slowest_per_round(result["zigzag"]["compute"])
    assert per_round.n == 2
    assert per_round.max == max(max(t.values) for t in result["zigzag"]["compute"])


def test_timing_more_ranks_than_cores_is_refused_before_any_process_starts(monkeypatch):
    def no_launch(*a, **k):
        raise AssertionError("a process was started for a run that cannot be timed")
    monkeypatch.setattr(rt, "launch", no_launch)
    monkeypatch.setattr(rt, "cpu_count", lambda: 2)
    with pytest.raises(ValueError, match=r"count_work\(4"):
        rt.run(4, seq=64)


@pytest.mark.slow
def test_untimed_counts_at_more_ranks_than_cores():
    counts = rt.count_work(4, seq=64)
    for kind in ra.LAYOUTS:
        assert counts[kind]["pairs"] == [rt.pairs_formula(64, 4, kind, r) for r in range(4)]
        assert counts[kind]["blocks"] == [rt.blocks_formula(4, kind, r) for r in range(4)]


def test_emulated_variants_differ_from_the_real_ones_only_in_the_link():
    real = {name: v for name, v in rt.VARIANTS.items() if v[2] is None}
    emulated = {name: v for name, v in rt.VARIANTS.items() if v[2] is not None}
    assert sorted(v[:2] for v in emulated.values()) == [("zigzag", False), ("zigzag", True)]
    assert all(v[:2] in [r[:2] for r in real.values()] for v in emulated.values())


def test_torch_sdpa_agrees_with_the_reference_convention():
    q, k, v, _ = ra.qkv(8, heads=1, head_dim=4)
    manual = F.softmax((q @ k.transpose(-2, -1) / 2.0).masked_fill(
        ~torch.ones(8, 8, dtype=torch.bool).tril(), -torch.inf), -1) @ v
    torch.testing.assert_close(ra.reference_attention(q, k, v), manual)


# ---- the merge checker (one process) ------------------------------------------------------

def _lse_sum(oa, la, ob, lb):
    return lab06d2.merge_attention_blocks(oa, la, ob, lb)[0], la + lb


def _lse_max(oa, la, ob, lb):
    return lab06d2.merge_attention_blocks(oa, la, ob, lb)[0], torch.maximum(la, lb)


def _averaged(oa, la, ob, lb):
    return (oa + ob) / 2, torch.logaddexp(la, lb)


def _not_renormalised(oa, la, ob, lb):
    m = torch.maximum(la, lb)
    return (torch.exp(la - m)[..., None] * oa + torch.exp(lb - m)[..., None] * ob,
            torch.logaddexp(la, lb))


def _swapped(oa, la, ob, lb):
    lse = torch.logaddexp(la, lb)
    return torch.exp(lb - lse)[..., None] * oa + torch.exp(la - lse)[..., None] * ob, lse


def _no_max_subtraction(oa, la, ob, lb):
    ea, eb = torch.exp(la), torch.exp(lb)
    return (ea / (ea + eb))[..., None] * oa + (eb / (ea + eb))[..., None] * ob, torch.log(ea + eb)


def _sigmoid_anchored_on_a(oa, la, ob, lb):
    """Stable for large logits (ring-flash-attention's update), NaN when lse_a = -inf."""
    return (oa - torch.sigmoid(lb - la)[..., None] * (oa - ob),
            la - F.logsigmoid(la - lb))


def _sigmoid_anchored_on_b(oa, la, ob, lb):
    return (ob - torch.sigmoid(la - lb)[..., None] * (ob - oa),
            lb - F.logsigmoid(lb - la))


def _max_subtracted(oa, la, ob, lb):
    m = torch.maximum(la, lb)
    wa, wb = torch.exp(la - m), torch.exp(lb - m)
    return ((wa / (wa + wb))[..., None] * oa + (wb / (wa + wb))[..., None] * ob,
            m + torch.log(wa + wb))


def _only_out(oa, la, ob, lb):
    return lab06d2.merge_attention_blocks(oa, la, ob, lb)[0]


def _stub(oa, la, ob, lb):
    raise NotImplementedError


@pytest.mark.parametrize("answer, verdict", checker_cases(lab06d2.merge_attention_blocks, {
    "averaged": (_averaged, ("case 1 of 4", "weights the blocks equally",
                             "exp(lse_block - lse)")),
    "lse_sum": (_lse_sum, ("lse: lse_a + lse_b", "torch.logaddexp")),
    "lse_max": (_lse_max, ("the larger block's lse", "torch.logaddexp")),
    "not_renormalised": (_not_renormalised, "not renormalised"),
    "swapped": (_swapped, "weights swapped"),
    "no_max_subtraction": (_no_max_subtraction, ("case 2 of 4", "large logits", "overflows")),
    "nan_when_a_masked": (_sigmoid_anchored_on_a, ("case 3 of 4", "NaN", "lse_a = -inf")),
    "nan_when_b_masked": (_sigmoid_anchored_on_b, ("case 4 of 4", "NaN", "lse_b = -inf")),
    "returns_out_only": (_only_out, "expected (out, lse), two tensors"),
    "stub": (_stub, "not implemented"),
}, passes="4 cases passed", also_right={"max_subtracted": _max_subtracted}))
def test_check_merge_attention_blocks(answer, verdict):
    assert_check(lu.check_merge_attention_blocks, answer, verdict)
