"""Tests of labutils.planner: ZeRO memory, FLOP counts, published rows, layout search."""
import csv
import os

import numpy as np
import pytest

from labutils import costmodel as cm
from labutils import planner as pl

pytestmark = pytest.mark.lab07


def test_zero_paper_example_exact():
    """Rajbhandari et al. 2020, Figure 1: 7.5 B parameters, Nd = 64 -> 120, 31.4, 16.6, 1.9 GB."""
    with open(os.path.join(pl.DATA, "rajbhandari2020_zero_example.csv")) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    got = [round(pl.zero_memory_per_gpu(7.5e9, 64, stage) / 1e9, 1) for stage in range(4)]
    assert got == [120.0, 31.4, 16.6, 1.9]
    assert got == [float(r["gigabytes_per_gpu"]) for r in rows]
    assert pl.zero_memory_per_gpu(7.5e9, 1, 3) == 16 * 7.5e9  # one rank: nothing to shard
    with pytest.raises(ValueError, match="stage"):
        pl.zero_memory_per_gpu(1e9, 8, 4)


def test_parameter_count_matches_the_published_sizes():
    for row in pl.narayanan2021():  # eq. 2 vs the table's parameter column: within 3%
        assert row["model"].num_params / 1e9 == pytest.approx(row["params_billion"], rel=0.03)
        gpus = row["layout"].world_size
        assert gpus * row["tflops_per_gpu"] / 1e3 == pytest.approx(row["aggregate_pflops"],
                                                                   rel=0.01)
    for row in pl.shoeybi2019():
        assert row["model"].num_params / 1e9 == pytest.approx(row["params_billion"], rel=0.05)


def test_iteration_flops_is_eq3():
    m = pl.Transformer(num_layers=2, hidden=64, num_heads=4, seq_len=32, vocab=100)
    B, s, l, h, V = 4, 32, 2, 64, 100
    assert m.iteration_flops(B) == pytest.approx(96 * B * s * l * h * h
                                                 * (1 + s / (6 * h) + V / (16 * l * h)))
    # without recomputation: 3/4 of the transformer layers, all of the logits (6 B s h V)
    assert m.iteration_flops(B, recompute=False) == pytest.approx(
        0.75 * 96 * B * s * l * h * h * (1 + s / (6 * h)) + 6 * B * s * h * V)


def test_memory_falls_with_each_form_of_sharding():
    m = pl.Transformer(48, 8192, 64)
    base = pl.memory_per_gpu(m, pl.Layout(dp=64))
    assert pl.memory_per_gpu(m, pl.Layout(dp=8, tp=8)) < base
    assert pl.memory_per_gpu(m, pl.Layout(dp=32, pp=2)) < base
    zero = [pl.memory_per_gpu(m, pl.Layout(dp=64, zero=z)) for z in range(4)]
    assert zero == sorted(zero, reverse=True)
    assert pl.memory_per_gpu(m, pl.Layout(dp=64), recompute=False) > base


def test_narayanan_rows_within_the_stated_error():
    """Calibrated on the 145.6 B row: every row within 20%; the rows with hidden >= 4096
    within 5% (the smallest models run less efficient GEMMs than one constant allows)."""
    rows = pl.compare_narayanan(calibrate_on=6)
    assert rows[6]["error"] == pytest.approx(0.0, abs=1e-6)
    errors = np.array([r["error"] for r in rows])
    assert np.all(np.abs(errors) < 0.20)
    assert np.all(np.abs(errors[2:]) < 0.05)
    assert np.mean(np.abs(errors)) < 0.05


def test_shoeybi_weak_scaling_within_the_stated_error():
    """Weak-scaling efficiency, calibrated on the 1-GPU baseline: each of the 8 points within
    10 percentage points of Figure 5, on average within 5."""
    rows = pl.compare_shoeybi()
    errors = np.array([r["error"] for r in rows])
    assert np.all(np.abs(errors) < 0.10)
    assert np.mean(np.abs(errors)) < 0.05
    predicted = [r["predicted"] for r in rows if r["layout"].dp == 1]
    assert predicted == sorted(predicted, reverse=True)  # more model parallelism, less efficient


def test_calibrate_inverts_predict():
    m = pl.Transformer(24, 2304, 24)
    layout = pl.Layout(dp=4, tp=2, pp=2)
    eff = pl.calibrate(m, layout, 64, "A100-80GB", 120e12)
    assert pl.predict(m, layout, 64, "A100-80GB", eff).flops_per_gpu == pytest.approx(120e12,
                                                                                       rel=1e-6)
    with pytest.raises(ValueError, match="100% of peak"):
        pl.calibrate(m, layout, 64, "A100-80GB", 400e12)


def test_bad_layouts_are_refused_with_the_fix():
    m = pl.Transformer(24, 2304, 24)
    with pytest.raises(ValueError, match="must divide num_layers"):
        pl.predict(m, pl.Layout(dp=1, pp=5), 8, "A100-80GB", 0.5)
    with pytest.raises(ValueError, match="multiple of dp x micro_batch"):
        pl.predict(m, pl.Layout(dp=3), 8, "A100-80GB", 0.5)


def test_search_ranks_feasible_layouts_and_needs_model_parallelism_for_big_models():
    small = pl.search(pl.Transformer(24, 2304, 24), 64, 512, "A100-80GB", 0.5)
    assert small and all(p.memory <= 80e9 for p in small)
    assert [p.flops_per_gpu for p in small] == sorted((p.flops_per_gpu for p in small),
                                                      reverse=True)
    assert small[0].layout.tp == 1 and small[0].layout.pp == 1  # fits: plain DP is fastest
    big = pl.search(pl.Transformer(96, 16384, 128), 1024, 2048, "A100-80GB", 0.5)
    assert big and all(p.layout.tp * p.layout.pp > 1 or p.layout.zero == 3 for p in big)
    assert all(p.layout.world_size == 1024 for p in big)


def test_step_model_pieces_add_up():
    m = pl.Transformer(48, 8192, 64)
    pred = pl.predict(m, pl.Layout(dp=32, tp=8, pp=2), 1536, "A100-80GB", 0.5)
    s = pred.step
    assert s.total == pytest.approx(s.compute + s.exposed_comm + s.bubble)
    assert s.bubble / s.total < cm.bubble_fraction(2, 48) * 1.01


@pytest.mark.slow
def test_zero_memory_checker_accepts_reference_and_rejects_typical_mistakes():
    import labutils as lu
    assert lu.check_zero_memory_per_gpu(pl.zero_memory_per_gpu).passed

    def forgets_fp16_weights(psi, nd, stage):  # stage 1 shards all 16 bytes
        return 16 * psi / nd if stage else 16 * psi

    def stage3_keeps_weights(psi, nd, stage):
        return pl.zero_memory_per_gpu(psi, nd, min(stage, 2))
    for wrong, stage in ((forgets_fp16_weights, "stage="), (stage3_keeps_weights, "stage=3")):
        result = lu.check_zero_memory_per_gpu(wrong)
        assert not result.passed and "expected" in result.message
        assert stage in result.message, result.message
