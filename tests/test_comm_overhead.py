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
