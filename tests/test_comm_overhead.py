"""labutils.experiments.comm_overhead: flat, bucketed and compressed all-reduce equal per-tensor all-reduce."""
import pytest
import torch

import labutils as lu
from labutils import comm_overhead as G

pytestmark = pytest.mark.lab03c

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
    calls = lu.launch(_compare, world_size=3)
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
