"""Labs 06c1 and 06c2's experiment (labutils.experiments.zero_training): the measured peak of every ZeRO
stage minus the activation baseline within 5% of the paper's formula on a model whose states
dominate; padding at a world size that divides no weight; collectives' buffers counted until
they die, on gloo's thread too (peaks that do not creep); the interleaved walk-through's shape
and its paired rounds; the general ZeRO components on a tied-head GPT
equal to one process and FSDP2."""
import pytest
import torch
import torch.distributed as dist

import labutils as lu
from labutils import zero_training as zt
from labutils.core.memory import live_peak

pytestmark = pytest.mark.lab06c1

PADDED_SIZES = (32, 64, 64, 8)  # 32 x 64 = 2,048 and 64 x 64 = 4,096: not multiples of 3


# ---- pure logic --------------------------------------------------------------------------

def test_padded_state_equals_the_formula_when_nothing_is_padded_and_exceeds_it_otherwise():
    numels = [2048, 64, 4096, 64, 512, 8]
    psi = sum(numels)
    for stage in range(4):
        assert zt.padded_state_bytes(numels, 2, stage) == lu.planspec.zero_state_bytes(psi, 2, stage)
    # 3 ranks: 2048 -> 2049, 64 -> 66, 4096 -> 4098, 64 -> 66, 512 -> 513, 8 -> 9
    pad = 2049 + 66 + 4098 + 66 + 513 + 9
    assert zt.padded_state_bytes(numels, 3, 0) == 16 * psi          # nothing sharded
    assert zt.padded_state_bytes(numels, 3, 1) == 4 * pad + 4 * psi + 8 * pad / 3
    assert zt.padded_state_bytes(numels, 3, 2) == 4 * pad + 12 * pad / 3
    assert zt.padded_state_bytes(numels, 3, 3) == 16 * pad / 3
    for stage in (1, 2, 3):
        extra = zt.padded_state_bytes(numels, 3, stage) - lu.planspec.zero_state_bytes(psi, 3, stage)
        assert 0 < extra <= 16 * 2 * len(numels)


def test_activation_baseline_leaves_the_model_trainable():
    model, x, y = zt.make_problem((16, 32, 8), batch=4)
    base = zt.activation_peak(model, x, y)
    assert 0 < base < sum(p.numel() for p in model.parameters()) * 4  # no weight gradient
    assert all(p.requires_grad and p.grad is None for p in model.parameters())


# ---- real ranks ---------------------------------------------------------------------------

@pytest.mark.slow
def test_every_stage_trains_equal_with_padding_and_holds_the_padded_formula():
    numels = [p.numel() for p in zt.make_problem(PADDED_SIZES)[0].parameters()]
    assert any(n % 3 for n in numels)
    single = zt.train_single(PADDED_SIZES, batch=12, steps=2)
    dp = zt.run_training("dp", 3, sizes=PADDED_SIZES, batch=12, steps=2)
    zt.assert_same_training(dp, single, "data parallel vs one process")
    for kind, stage in (("zero1", 1), ("zero2", 2), ("zero3", 3)):
        res = zt.run_training(kind, 3, sizes=PADDED_SIZES, batch=12, steps=2)
        zt.assert_same_training(res, dp, f"{kind} vs data parallel, 3 ranks")
        assert sum(res["state"].values()) == zt.padded_state_bytes(numels, 3, stage), kind
        carried = sum(lu.zero_optimizer.padded(n, 3) for n in numels)
        assert res["volume_bytes_per_step"] == lu.sharding.zero_volume_formula(stage) * 4 * carried


def _peaks(rank, world_size, calls):
    def loop(collective):
        for _ in range(calls):
            full, shard = torch.ones(2 ** 16), torch.empty(2 ** 16 // world_size)
            collective(full, shard)
            del full, shard  # before the next pair exists
    rs = lambda full, shard: dist.reduce_scatter_single(shard, full)  # noqa: E731
    ag = lambda full, shard: dist.all_gather_single(full, shard)  # noqa: E731
    ar = lambda full, shard: dist.all_reduce(full)  # noqa: E731
    return [live_peak(loop, c)[1] for c in (rs, ag, ar)]


@pytest.mark.slow
def test_measured_peak_of_collectives_does_not_creep_with_their_number():
    # one call of each: the full tensor (256 KiB) and the shard (128 KiB), nothing else that
    # an op made (gloo's own buffers are allocated inside the call, by no op). gloo runs the
    # collectives on its worker threads (2, ProcessGroupGloo's default), and each may still
    # hold the last call it ran, with its tensors, for a moment after the call returns; they
    # are counted until then, and then freed: 20 calls in a row never hold more than 2 extra
    # pairs (seen: 2 extra all-reduce inputs at once on a loaded machine).
    assert dist.ProcessGroupGloo._Options()._threads == 2
    one = lu.launch(_peaks, 1, world_size=2)
    many = lu.launch(_peaks, 20, world_size=2)
    pair = 2 ** 18 * 3 // 2
    for peaks, peaks20 in zip(one, many):
        assert peaks == [pair] * 3
        assert all(pair <= p <= 3 * pair for p in peaks20), peaks20


@pytest.mark.slow
def test_measured_peak_minus_baseline_matches_the_zero_formula_within_5_percent():
    mem = zt.memory_vs_formula(world_size=2, width=256, depth=64, batch=8)
    assert mem["psi"] == 64 * 256 * 257
    formulas = [mem["rows"][k]["formula"] for k in ("dp", "zero1", "zero2", "zero3")]
    assert formulas == sorted(formulas, reverse=True)  # each stage shards one thing more
    for kind, row in mem["rows"].items():
        for peak, base in zip(row["peak"], row["baseline"]):
            assert 0 < base < 0.01 * row["formula"], kind  # the model states dominate
            rest = peak - base - row["formula"]
            assert abs(rest) <= 0.05 * row["formula"], (kind, rest / row["formula"])


def test_walkthrough_rows_must_change_one_setting_each(monkeypatch):
    monkeypatch.setattr(zt, "launch", lambda *a, **k: pytest.fail("launched"))
    rows = [("dp", "dp", {}), ("+ checkpoint", "dp", {"checkpoint": True}),
            ("FSDP2, no checkpoint", "fsdp", {"autocast": True})]
    assert zt.changes(rows[0], rows[1]) == ["checkpoint"]
    assert zt.changes(rows[1], rows[2]) == ["sharding", "checkpoint", "autocast"]
    zt.validate_walk(rows[:2])
    with pytest.raises(ValueError, match=r"'FSDP2, no checkpoint' changes 3 settings"):
        zt.run_walkthrough(rows)
    with pytest.raises(ValueError, match="changes 0 settings"):
        zt.validate_walk([rows[0], ("again", "dp", {})])
    with pytest.raises(ValueError, match="kind one of"):
        zt.validate_walk([("x", "zero4", {})])


@pytest.mark.slow
@pytest.mark.lab06c2
def test_walkthrough_interleaves_every_variant_and_measures_each_peak():
    variants = [("dp", "dp", {}), ("+ checkpoint", "dp", {"checkpoint": True}),
                ("zero3", "zero3", {"checkpoint": True}),
                ("fsdp", "fsdp", {"checkpoint": True}),
                ("fsdp bf16 gathers", "fsdp_bf16", {"checkpoint": True})]
    walk = zt.run_walkthrough(variants, world_size=2, sizes=(16,) + (32,) * 4 + (8,), batch=64,
                              repeats=5)
    assert list(walk) == [label for label, _, _ in variants]
    for row in walk.values():
        assert row["time"].n == 5 and row["time"].min > 0
        assert row["peak"] > 0
    c = lu.timing.compare(walk["fsdp bf16 gathers"]["time"], walk["dp"]["time"])
    assert c.paired  # round i of every variant ran side by side


@pytest.mark.slow
@pytest.mark.lab06c2
def test_general_components_on_a_tied_gpt_equal_one_process_and_fsdp2():
    comp = lu.zero_components.run_components(world_size=2)
    assert "head.weight" not in comp["one process"]["params"]  # tied: named once, as tok_emb
    for way in ("zero3", "fsdp2", "zero_optimizer"):
        lu.zero_components.assert_same(comp[way], comp["one process"], way)
    wrong = {"losses": comp["zero3"]["losses"], "params": dict(comp["zero3"]["params"])}
    wrong["params"]["ln_f.bias"] = wrong["params"]["ln_f.bias"] + 1e-3
    with pytest.raises(AssertionError, match="ln_f.bias"):  # the comparison can fail
        lu.zero_components.assert_same(wrong, comp["fsdp2"], "wrong")
