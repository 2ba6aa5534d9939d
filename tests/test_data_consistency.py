"""labutils.experiments.data_consistency: set_epoch, DDP's buffer broadcast, BatchNorm per rank
vs synchronised, each against what must hold."""
import pytest
import torch

from labutils.experiments import data_consistency as D

pytestmark = pytest.mark.lab03e1


@pytest.mark.slow
def test_sampler_without_set_epoch_repeats_its_batches():
    res = D.sampler_effect(seeds=(0,), epochs=3, batch_size=16)
    per_epoch = -(-(1437 // 2 + 1437 % 2) // 16)     # 719 indices per rank, in batches of 16
    assert res[(0, False)]["distinct_batches"] == per_epoch
    assert res[(0, True)]["distinct_batches"] == 3 * per_epoch
    for r in res.values():
        assert len(r["test_loss"]) == 3 and all(0 <= a <= 1 for a in r["test_accuracy"])
    # the first epoch is the same order either way (set_epoch(0) is the default): same result
    assert res[(0, False)]["test_loss"][0] == res[(0, True)]["test_loss"][0]


@pytest.mark.slow
def test_broadcast_buffers_copies_rank_0s_statistics():
    on = D.batchnorm_training(D.BN_MODES[0], epochs=1)
    off = D.batchnorm_training(D.BN_MODES[1], epochs=1)
    # with the broadcast every forward starts from rank 0's running statistics ...
    torch.testing.assert_close(on[0]["running_means"], on[1]["running_means"], rtol=0, atol=0)
    # ... without it each rank keeps its own shard's, far apart on class-sorted shards
    assert (off[0]["running_means"] - off[1]["running_means"]).abs().max() > 0.05
    # rank 0's statistics never see rank 1's data either way: rank 0 ends the same
    assert on[0]["test_loss"] == pytest.approx(off[0]["test_loss"], rel=1e-5)
    assert on[0]["steps"] == off[0]["steps"] == 1437 // 2 // 8


@pytest.mark.slow
def test_sync_batchnorm_trains_in_step_on_every_rank():
    res = D.batchnorm_training("SyncBatchNorm", epochs=1)
    torch.testing.assert_close(res[0]["running_means"], res[1]["running_means"])
    assert res[0]["test_loss"] == pytest.approx(res[1]["test_loss"], rel=1e-5)
    with pytest.raises(ValueError, match="mode"):
        D.batchnorm_training("sync")


@pytest.mark.slow
@pytest.mark.parametrize("sync", [True, False])
def test_batchnorm_step_against_the_whole_batch(sync):
    # float64: the ranks sum the batch statistics in another order than one process; in
    # float64 the difference (~1e-16 relative) is far inside assert_close's defaults on any CPU
    ranks, ref = D.batchnorm_step(sync, batch=48, dtype=torch.float64)
    out = torch.cat([r["out"] for r in ranks])
    if sync:
        torch.testing.assert_close(out, ref["out"])
        for r in ranks:
            torch.testing.assert_close(r["running_mean"], ref["running_mean"])
            torch.testing.assert_close(r["running_var"], ref["running_var"])
            for g, e in zip(r["grads"], ref["grads"]):
                torch.testing.assert_close(g, e)
    else:  # per-rank statistics of class-sorted shards: other outputs, other gradients
        assert (out - ref["out"]).abs().max() > 0.01
        w = ranks[0]["grads"][0]
        assert (w - ref["grads"][0]).norm() > 0.05 * ref["grads"][0].norm()


def test_epoch_crop_is_seeded_by_the_epoch():
    img = torch.arange(64.0).view(1, 8, 8)
    crop, (dy, dx) = D.epoch_crop(img, 5, 0)
    assert crop.shape == (1, 8, 8) and dy in (0, 1, 2) and dx in (0, 1, 2)
    padded = torch.nn.functional.pad(img, (1, 1, 1, 1))
    assert torch.equal(crop, padded[..., dy:dy + 8, dx:dx + 8])
    assert D.epoch_crop(img, 5, 0)[1] == (dy, dx)                 # same epoch: same crop
    shifts = {D.epoch_crop(img, i, e)[1] for i in range(20) for e in range(3)}
    assert len(shifts) > 3                                         # the draws do vary
    per_epoch = [[D.epoch_crop(img, i, e)[1] for i in range(20)] for e in range(3)]
    assert per_epoch[0] != per_epoch[1] != per_epoch[2]


@pytest.mark.slow
def test_without_set_epoch_the_augmentation_repeats():
    res = D.sampler_effect(seeds=(0,), epochs=3, batch_size=16, augment=True)
    per_rank = 1437 // 2 + 1437 % 2
    off, on = res[(0, False)], res[(0, True)]
    # no set_epoch: the same half of the data, each sample with one crop, every epoch
    assert off["distinct_samples"] == off["distinct_pairs"] == per_rank
    assert on["distinct_samples"] > per_rank
    assert on["distinct_pairs"] > 2 * per_rank
    assert all(r["distinct_pairs"] is None for r in
               D.sampler_effect(seeds=(0,), epochs=1).values())


def test_class_shard_splits_by_class_or_at_random():
    y = torch.arange(10).repeat_interleave(20)
    X = torch.arange(len(y)).float()[:, None]
    for shuffle in (False, True):
        parts = [D.class_shard(X, y, r, 2, shuffle) for r in range(2)]
        # disjoint shares that cover the data, either way
        assert sorted(torch.cat([p[0][:, 0] for p in parts]).tolist()) == X[:, 0].tolist()
        low, high = (set(p[1].tolist()) for p in parts)
        if shuffle:   # a random split: both ranks see (nearly) every class
            assert len(low) >= 9 and len(high) >= 9
        else:         # the lower and upper halves of the sorted labels
            assert low == {0, 1, 2, 3, 4} and high == {5, 6, 7, 8, 9}
