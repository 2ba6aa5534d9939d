"""labutils.experiments.comm_overhead: flat, bucketed and compressed all-reduce equal per-tensor
all-reduce; and the checker of lab 03d's exercise (fp16_mean)."""
import pytest
import torch

import labutils as lu
from labutils import comm_overhead as G
from labutils.exercises import lab03d as C

from .checkers import assert_check, checker_cases

pytestmark = pytest.mark.lab03d

SHAPES = [(3, 5), (7,), (1,), (4, 4, 2), (11,)]


def _compare(rank, world_size):
    import torch.distributed as dist
    g = torch.Generator().manual_seed(rank)
    grads = [torch.randn(s, generator=g) for s in SHAPES]
    expected = [t.clone() for t in grads]
    for t in expected:
        dist.all_reduce(t)
    calls = {}
    for label, fn, tol in [("flat", G.allreduce_flat, {}),
                           ("buckets", lambda ts: G.allreduce_buckets(ts, 64), {}),
                           ("fp16", lambda ts: G.allreduce_compressed(ts, torch.float16),
                            {"rtol": 1e-2, "atol": 1e-2}),
                           ("bf16", lambda ts: G.allreduce_compressed(ts, torch.bfloat16),
                            {"rtol": 4e-2, "atol": 4e-2})]:
        got = [t.clone() for t in grads]
        calls[label] = fn(got)
        for e, t in zip(expected, got):
            torch.testing.assert_close(t, e, **tol)
    return calls


@pytest.mark.slow
def test_variants_equal_per_tensor_all_reduce():
    calls = lu.launch(_compare, world_size=3, warn_oversubscription=False)  # times nothing
    assert calls[0] == {"flat": 1, "buckets": 3, "fp16": 1, "bf16": 1}


def test_make_buckets():
    ts = [torch.zeros(s) for s in SHAPES]  # 60, 28, 4, 128, 44 bytes
    assert G.make_buckets(ts, 64) == [[0, 1], [2, 3], [4]]
    assert G.make_buckets(ts, 1) == [[0], [1], [2], [3], [4]]
    assert G.make_buckets(ts, 10 ** 6) == [[0, 1, 2, 3, 4]]


@pytest.mark.slow
def test_measure_gradient_sync_counts_calls_and_bytes():
    model = lu.models.mlp((8, 8, 8, 2))  # 6 tensors, 162 parameters
    res = G.measure_gradient_sync(model, world_size=2, bucket_sizes=(256,), repeats=2)
    assert res["per tensor"][1] == 6 and res["flat buffer"][1] == 1
    assert res["flat buffer"][2] == 162 * 4 and res["flat fp16"][2] == 162 * 2
    with pytest.raises(ValueError, match="world_size"):
        G.measure_gradient_sync(model, world_size=1)


@pytest.mark.slow
def test_measure_call_cost_times_the_parts_and_fits_alpha():
    model = lu.models.mlp((8, 8, 8, 2))  # 6 tensors
    res = G.measure_call_cost(model, world_size=2, sizes=(64, 1024, 16384), repeats=2)
    assert set(res["stats"]) == {"per tensor", G.CONTROL, "flat buffer", "one ready flat buffer"}
    assert len({s.rounds for s in res["stats"].values()}) == 1       # paired round by round
    assert all(s.n == 2 for s in res["stats"].values())
    assert len(res["sweep"]) == 3 and res["alpha"].n == res["beta"].n == 2   # a fit per repeat
    assert res["alpha"].min >= 0 and res["beta"].min >= 0
    assert res["shapes"] == [(8, 8), (8,), (8, 8), (8,), (2, 8), (2,)]
    with pytest.raises(ValueError, match="world_size"):
        G.measure_call_cost(model, world_size=1)


TINY = 2.0 ** -26     # below fp16's 2^-25: rounds to 0
SUBNORMAL = 2.0 ** -20  # below fp16's smallest normal 2^-14: 5 significant bits, not 10


def _scaled(rank, world_size):
    import torch.distributed as dist
    grad = torch.tensor([1.0, TINY, SUBNORMAL * (1 + 2 ** -9), -0.5])   # the same on every rank
    exact = grad * world_size
    scale = G.gradient_scale(grad, world_size)
    plain, plain_back = G.allreduce_scaled(grad.clone())
    wire, back = G.allreduce_scaled(grad.clone(), scale)
    peak = torch.tensor([float(rank)])
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return scale, plain, plain_back, wire, back, exact


@pytest.mark.slow
def test_scaling_before_the_cast_undoes_fp16_underflow():
    scale, plain, plain_back, wire, back, exact = lu.launch(_scaled, world_size=2)[0]
    assert scale == 2.0 ** 14                 # 65504 / (2 ranks * 1.0) -> the power of two below
    assert plain.dtype == wire.dtype == torch.float16
    assert plain[1] == 0 and plain_back[1] == 0           # flushed to zero unscaled
    assert plain_back[2] != exact[2]                       # subnormal: bits lost
    assert torch.equal(back, exact)                        # scaled: every value exact
    assert float(wire.abs().max()) <= torch.finfo(torch.float16).max


@pytest.mark.slow
def test_measure_underflow_counts_are_consistent():
    X, y = lu.datasets.digits("train")
    X = X.flatten(1)[:256]
    cfg = lu.async_sgd.SGDConfig(steps=5, batch_size=16, lr=0.1)
    params = lu.async_sgd.init_params(64, 10, cfg) * 1e-2   # small weights: small gradients
    u = G.measure_underflow(params, X, y[:256], cfg, step=0)
    assert u["elements"] == params.numel() and 0 < u["nonzero"] <= 2 * u["elements"]  # 2 ranks
    f16, scaled, bf16 = u["float16"], u["float16, scaled"], u["bfloat16"]
    assert f16["scale"] == bf16["scale"] == 1.0 and scaled["scale"] > 1
    assert f16["flushed"] > 0 and f16["subnormal"] > f16["flushed"] and f16["off"] > 0
    assert scaled["flushed"] == scaled["subnormal"] == scaled["off"] == 0
    assert bf16["flushed"] == bf16["subnormal"] == 0


# --- the exercise of lab 03d: the mean gradient in one fp16 all-reduce -----------------------

def _per_tensor(tensors, world_size):
    import torch.distributed as dist
    for t in tensors:
        half = (t / world_size).half()
        dist.all_reduce(half)
        t.copy_(half)


def _fp32(tensors, world_size):
    import torch.distributed as dist
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    flat /= world_size
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t))


def _divide_after(tensors, world_size):
    import torch.distributed as dist
    flat = torch.cat([t.reshape(-1) for t in tensors]).half()
    dist.all_reduce(flat)
    flat /= world_size
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t))


def _returns_new(tensors, world_size):
    import torch.distributed as dist
    flat = (torch.cat([t.reshape(-1) for t in tensors]) / world_size).half()
    dist.all_reduce(flat)
    return [p.view_as(t).float() for t, p in zip(tensors, flat.split([t.numel() for t in tensors]))]


def _stub(tensors, world_size):
    raise NotImplementedError


@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(C.fp16_mean, {
    "one_call_per_tensor": (_per_tensor, ("all-reduce calls", "expected 1")),
    "sends_fp32": (_fp32, ("dtype sent", "float16", "float32")),
    "divides_after_the_sum": (_divide_after, ("overflowed", "divide by world_size before")),
    "not_in_place": (_returns_new, ("unchanged", "copy_")),
    "stub": (_stub, "not implemented"),
}, passes="passed"))
def test_fp16_mean_checker(answer, verdict):
    assert_check(lu.check_fp16_mean, answer, verdict)


def test_an_unknown_emulated_link_is_named_before_any_rank_starts():
    with pytest.raises(ValueError, match="unknown link '2GbE'"):
        G.measure_gradient_sync(lu.models.mlp((4, 4)), link="2GbE")


@pytest.mark.slow
def test_an_emulated_link_changes_time_not_calls_or_bytes():
    model = lu.models.mlp((64, 256, 10))
    plain = G.measure_gradient_sync(model, bucket_sizes=(16 * 1024,), repeats=1)
    slow = G.measure_gradient_sync(model, bucket_sizes=(16 * 1024,), repeats=1, link="1GbE")
    assert {k: v[1:] for k, v in plain.items()} == {k: v[1:] for k, v in slow.items()}
