"""Mixed precision counted (labutils.experiments.mixed_precision, lab 06c2): bf16 autocast keeps
every stored tensor fp32, and FSDP2's MixedPrecisionPolicy all-gathers bf16 weights (half the
bytes, counted at the dispatcher) while it reduces the gradients in fp32 into fp32 shards."""
import pytest
import torch

import labutils as lu

pytestmark = pytest.mark.lab06c2


def test_autocast_leaves_weights_gradients_and_adam_state_in_fp32():
    held = lu.mixed_precision.autocast_state(sizes=(8, 16, 4), batch=4)  # one process, no ranks
    psi = 8 * 16 + 16 + 16 * 4 + 4
    assert held["psi"] == psi and held["logits"] == "torch.bfloat16"
    assert held["weights"] == {"float32": 4 * psi} and held["gradients"] == {"float32": 4 * psi}
    assert held["adam"] == {"float32": 8 * psi}


def test_mixed_precision_formula_equals_fp32_until_the_optimizer_is_sharded():
    for n in (2, 4, 64):
        fp32 = [lu.planspec.zero_state_bytes(1, n, s) for s in range(4)]
        mixed = [lu.planspec.zero_state_bytes(1, n, s, 2, 2, 12) for s in range(4)]
        assert fp32[0] == mixed[0] == 16 and fp32[3] == mixed[3] == 16 / n
        assert mixed[1] < fp32[1] and mixed[2] < fp32[2]


def test_bad_traffic_batch_refused_before_launch(monkeypatch):
    monkeypatch.setattr(lu.mixed_precision, "launch", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(ValueError, match="batch 7 does not split evenly over 2 ranks"):
        lu.mixed_precision.run_fsdp_traffic(world_size=2, batch=7)


@pytest.mark.slow
def test_bf16_all_gathers_move_half_the_bytes_and_reduce_in_fp32():
    sizes = (16, 32, 8)
    traffic = lu.mixed_precision.run_fsdp_traffic(world_size=2, sizes=sizes, batch=8)
    psi = 16 * 32 + 32 + 32 * 8 + 8
    fp32, bf16 = traffic["fp32"], traffic["bf16"]
    # every weight gathered twice (forward, backward) but the root's, kept from forward
    assert 4 * psi < fp32["all_gather"] <= 2 * 4 * psi
    assert 2 * bf16["all_gather"] == fp32["all_gather"] and bf16["calls"] == fp32["calls"]
    assert bf16["reduce_scatter"] == fp32["reduce_scatter"] == 4 * psi  # fp32, padded to 2
    assert bf16["shard_dtypes"] == fp32["shard_dtypes"] == ["torch.float32"]
    torch.testing.assert_close(bf16["loss"], fp32["loss"], atol=2e-2, rtol=2e-2)


@pytest.mark.slow
def test_fsdp2_with_bf16_all_gathers_trains_close_to_fp32():
    kw = dict(sizes=(16,) + (32,) * 4 + (8,), batch=8, steps=2)
    fp32 = lu.zero_training.run_training("fsdp", 2, **kw)
    bf16 = lu.zero_training.run_training("fsdp_bf16", 2, **kw)
    # bf16 keeps 8 significant bits; a wrong reduction (sum, no average) is off by O(1)
    torch.testing.assert_close(bf16["losses"], fp32["losses"], atol=2e-2, rtol=2e-2)
    assert not torch.equal(bf16["losses"], fp32["losses"])  # bf16 really was used
