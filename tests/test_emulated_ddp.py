"""Tests of labutils.experiments.emulated_ddp: DDP on emulated links (04c section 6)."""
import pytest

from labutils import costmodel as cm
from labutils import emulated_ddp as ed

pytestmark = [pytest.mark.lab04c2]


@pytest.mark.slow
def test_variants_send_the_same_gradients():
    # run() raises if a fp32 variant's gradients differ at all from another's, or bf16's by
    # more than bf16 rounding. Step times against the link's floor are timings: targets of
    # `python -m labutils.bench emulated_ddp`, not tests.
    slow = cm.Link("10MbE", 1.25e6, 100e-6)
    rows = ed.run(links=(slow, "1GbE"), steps=2, width=96, depth=3, batch=16)
    assert [(r["link"], r["variant"]) for r in rows] == [
        (link, v) for link in ("10MbE", "1GbE") for v in ed.VARIANTS]
    for r in rows:
        assert r["step"].n == 2 and r["predicted"] > 0


def test_check_gradients_names_the_variant_that_changed_them():
    per_rank = [{"grad_diff": {("1GbE", "one bucket"): 0.0, ("1GbE", "buckets"): 0.0,
                               ("1GbE", "buckets + bf16"): 3e-3}},
                {"grad_diff": {("1GbE", "one bucket"): 0.0, ("1GbE", "buckets"): 1e-7,
                               ("1GbE", "buckets + bf16"): 3e-3}}]
    with pytest.raises(AssertionError, match=r"rank 1: buckets on 1GbE changed the gradients"):
        ed.assert_same_gradients(per_rank, ed.VARIANTS)
    per_rank[1]["grad_diff"][("1GbE", "buckets")] = 0.0
    ed.assert_same_gradients(per_rank, ed.VARIANTS)   # bf16 rounding is allowed
    per_rank[0]["grad_diff"][("1GbE", "buckets + bf16")] = 0.5
    with pytest.raises(AssertionError, match=r"rank 0: buckets \+ bf16"):
        ed.assert_same_gradients(per_rank, ed.VARIANTS)


def test_predict_uses_the_slower_of_link_and_machine():
    fast = ed.predict(0.05, 4e6, "NVLink", 2, num_buckets=1, overlap=False, compressed=False)
    assert fast == pytest.approx(2.0, rel=1e-3)
    floored = ed.predict(0.05, 4e6, "NVLink", 2, num_buckets=1, overlap=False, compressed=False,
                         floor=(5e-4, 1 / 0.5e9))
    comm = cm.allreduce_time(4e6, 2, 5e-4, 1 / 0.5e9)
    assert floored == pytest.approx(2 * 0.05 / (0.05 + comm))
    # overlap hides the slow link's transfer behind backward, but not this machine's own
    # all-reduce (CPU work on the cores that run backward)
    hidden = ed.predict(0.5, 4e6, "10GbE", 2, num_buckets=8, overlap=True, compressed=False,
                        floor=(5e-4, 1 / 0.5e9))
    here = 8 * cm.allreduce_time(4e6 / 8, 2, 5e-4, 1 / 0.5e9)
    assert hidden == pytest.approx(2 * 0.5 / (0.5 + here))
    # bf16 halves the bytes; overlap hides up to 2/3 of compute
    plain = ed.predict(0.02, 4e6, "1GbE", 2, 1, overlap=False, compressed=False)
    bf16 = ed.predict(0.02, 4e6, "1GbE", 2, 1, overlap=False, compressed=True)
    overlapped = ed.predict(0.02, 4e6, "1GbE", 2, 4, overlap=True, compressed=False)
    comm = cm.allreduce_time(4e6, 2, 50e-6, 1 / 125e6)
    assert plain == pytest.approx(2 * 0.02 / (0.02 + comm))
    assert bf16 == pytest.approx(2 * 0.02 / (0.02 + cm.allreduce_time(2e6, 2, 50e-6, 1 / 125e6)))
    comm4 = 4 * cm.allreduce_time(1e6, 2, 50e-6, 1 / 125e6)
    assert overlapped == pytest.approx(2 * 0.02 / (0.02 + comm4 - 2 / 3 * 0.02 * 3 / 4))


def test_binding_floor_names_the_slower_all_reduce():
    """1 MB of gradients in 4 buckets on 2 ranks: on 1 GbE (alpha 50 us, 125 MB/s) the wire
    takes about 8 ms; a machine whose own all-reduce costs alpha 10 ms binds instead, one of
    alpha 1 us and 100 GB/s does not."""
    slow_here, fast_here = (10e-3, 1e-11), (1e-6, 1e-11)
    assert ed.binding_floor(1e6, "1GbE", 2, 4, False, slow_here) == "local"
    assert ed.binding_floor(1e6, "1GbE", 2, 4, False, fast_here) == "link"
    assert ed.binding_floor(1e6, "1GbE", 2, 4, False, None) is None
    # compression halves the bytes on both sides: a floor between the two sends flips
    link = cm.get_link("1GbE")
    fp32 = cm.allreduce_time(1e6 / 4, 2, link.alpha, link.beta) * 4
    fp16 = cm.allreduce_time(0.5e6 / 4, 2, link.alpha, link.beta) * 4
    between = ((fp16 + fp32) / 2 / 4 / 2, 1e-12)   # per bucket 2 alpha: the floor's time
    assert ed.binding_floor(1e6, "1GbE", 2, 4, False, between) == "link"
    assert ed.binding_floor(1e6, "1GbE", 2, 4, True, between) == "local"


def test_real_rows_need_the_fitted_floor():
    with pytest.raises(ValueError, match="floor"):
        ed.run([ed.REAL], steps=1, width=16, depth=1, batch=8)
