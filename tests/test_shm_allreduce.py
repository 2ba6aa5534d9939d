"""labutils.parallel.shm_allreduce: equal to dist.all_reduce, usable as a DDP comm hook, leaves no segment."""
import os

import pytest
import torch

import labutils as lu
from labutils import shm_allreduce
from labutils.parallel.shm_allreduce import ShmAllReduce, shm_allreduce_hook

LENGTHS = (1, 7, 64, 65, 301)  # 64 floats per 256-byte chunk: one, two and five chunks


def _compare(rank, world_size, dtype):
    import torch.distributed as dist
    results = []
    with ShmAllReduce(chunk_bytes=256) as shm:
        for repeat in range(2):          # repeated calls reuse the segment and its flags
            for n in LENGTHS:
                g = torch.Generator().manual_seed(1000 * repeat + 10 * n + rank)
                x = torch.randn(n, generator=g).to(dtype)
                expected, got = x.clone(), x.clone()
                dist.all_reduce(expected)
                shm.all_reduce_(got)
                results.append((n, expected, got))
        matrix = (torch.arange(12.0).reshape(3, 4) * (rank + 1)).to(dtype)  # 2-D, in place
        shm.all_reduce_(matrix)
        results.append(("matrix", (torch.arange(12.0).reshape(3, 4)
                                   * sum(range(1, world_size + 1))).to(dtype),
                        matrix))
    return results


def _compare_zero_copy(rank, world_size, dtype):
    import torch.distributed as dist
    results = []
    with ShmAllReduce(chunk_bytes=256, buffer_bytes=max(LENGTHS) * 4) as shm:
        for repeat in range(2):          # repeated calls reuse the buffers and the flags
            for n in LENGTHS:
                g = torch.Generator().manual_seed(1000 * repeat + 10 * n + rank)
                x = torch.randn(n, generator=g).to(dtype)
                expected = x.clone()
                dist.all_reduce(expected)
                got = shm.buffer(n, dtype)
                got.copy_(x)
                shm.all_reduce_(got)      # the zero-copy path: no copy in or out
                results.append((n, expected, got.clone()))
            other = torch.full((5,), float(rank), dtype=dtype)   # the copy path still works
            shm.all_reduce_(other)
            results.append(("copy path", torch.full((5,), float(sum(range(world_size))),
                                                    dtype=dtype), other))
        with pytest.raises(ValueError, match=r"ShmAllReduce\(buffer_bytes="):
            shm.buffer(max(LENGTHS) + 1000, torch.float32)
    return results


def _shm_entries():
    return {name for name in os.listdir(shm_allreduce._SHM_DIR) if name.startswith("lu_shm_")}


def _launch_and_compare(worker, world_size, dtype):
    """Run ``worker`` on real ranks; every result must match gloo's and be identical on every
    rank (each element is summed once, by one rank); nothing may be left in /dev/shm."""
    before = _shm_entries()
    per_rank = lu.launch(worker, dtype, world_size=world_size)
    for rank, results in enumerate(per_rank):
        for n, expected, got in results:
            assert got.dtype == dtype
            # bf16 rounds after each of the p-1 additions and gloo adds in another order, so
            # allow a rounding step (2**-8 relative) per addition; fp32 keeps the default
            tol = ({"rtol": (world_size - 1) * 2**-8, "atol": (world_size - 1) * 2**-7}
                   if dtype == torch.bfloat16 else {})
            torch.testing.assert_close(got, expected, **tol,
                                       msg=lambda m: f"rank {rank}, n={n}: {m}")
        for (_, _, got), (_, _, got0) in zip(results, per_rank[0]):
            assert torch.equal(got, got0)
    assert _shm_entries() == before  # unlinked once mapped: nothing left in /dev/shm


WORLD_SIZES_DTYPES = [(2, torch.float32), (2, torch.bfloat16), (3, torch.float32),
                      (4, torch.bfloat16)]


@pytest.mark.lab04c2
@pytest.mark.slow
@pytest.mark.parametrize("world_size,dtype", WORLD_SIZES_DTYPES)
def test_equal_to_dist_all_reduce(world_size, dtype):
    _launch_and_compare(_compare, world_size, dtype)


@pytest.mark.lab04c2
@pytest.mark.slow
@pytest.mark.parametrize("world_size,dtype", WORLD_SIZES_DTYPES)
def test_zero_copy_buffer_equal_to_dist_all_reduce(world_size, dtype):
    _launch_and_compare(_compare_zero_copy, world_size, dtype)


def _crash_after_create(rank, world_size):
    shm = ShmAllReduce(chunk_bytes=256)
    shm.all_reduce_(torch.ones(10))
    raise RuntimeError("boom")  # no close(): the process just dies


@pytest.mark.lab04c2
@pytest.mark.slow
def test_no_segment_left_when_a_rank_dies():
    before = _shm_entries()
    with pytest.raises(lu.WorkerError, match="boom"):
        lu.launch(_crash_after_create, world_size=2)
    assert _shm_entries() == before


def _ddp_with_hook(rank, world_size, use_shm):
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 3))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
    shm = None
    if use_shm:
        shm = ShmAllReduce(chunk_bytes=1024)
        ddp.register_comm_hook(shm, shm_allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        opt.zero_grad()
        nn.functional.mse_loss(ddp(torch.randn(5, 8, generator=g)),
                               torch.randn(5, 3, generator=g)).backward()
        opt.step()
    if shm:
        shm.close()
    return {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.lab04c2
@pytest.mark.slow
def test_as_ddp_comm_hook_equals_default_ddp():
    default = lu.launch(_ddp_with_hook, False, world_size=2)
    with_shm = lu.launch(_ddp_with_hook, True, world_size=2)
    for rank in range(2):
        torch.testing.assert_close(with_shm[rank], default[rank])


def _bad_input(rank, world_size):
    with ShmAllReduce(chunk_bytes=256) as shm:
        shm.all_reduce_(torch.ones(4, 4).t())


@pytest.mark.lab04c2
@pytest.mark.slow
def test_non_contiguous_refused_with_fix():
    with pytest.raises(lu.WorkerError, match=r"contiguous.*\.contiguous\(\)"):
        lu.launch(_bad_input, world_size=2)


# ---- CPUs without x86's store order (ARM, Apple silicon): refused, gloo instead ------------

def _on_arm(rank, world_size):
    """In the rank, pretend the CPU is arm64: ShmAllReduce must refuse on every rank (before
    any collective, so none is left waiting), and make_all_reduce must fall back to gloo."""
    import warnings
    from unittest import mock

    import torch.distributed as dist
    with mock.patch.object(shm_allreduce.platform, "machine", return_value="arm64"):
        try:
            ShmAllReduce()
            refused = None
        except shm_allreduce.UnsupportedCPU as e:
            refused = str(e)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            reducer = shm_allreduce.make_all_reduce(buffer_bytes=64)
        x = torch.tensor([1.0, 2.0]) * (rank + 1)
        reducer.all_reduce_(x)
        expected = torch.tensor([1.0, 2.0]) * (rank + 1)
        dist.all_reduce(expected)
        reducer.close()
    return refused, [str(w.message) for w in caught], type(reducer).__name__, x, expected


@pytest.mark.lab04c2
def test_store_order_is_known_per_cpu():
    assert shm_allreduce.supported("x86_64") and shm_allreduce.supported("AMD64")
    for machine in ("arm64", "aarch64", "armv7l", "ppc64le", "riscv64", "s390x"):
        assert not shm_allreduce.supported(machine), machine


@pytest.mark.lab04c2
@pytest.mark.slow
def test_non_x86_refused_and_falls_back_to_gloo():
    for refused, warned, kind, got, expected in lu.launch(_on_arm, world_size=2):
        assert refused is not None and "'arm64'" in refused and "gloo" in refused
        assert kind == "GlooAllReduce"
        assert any("using gloo instead" in w for w in warned), warned
        assert torch.equal(got, expected)  # the fall-back sums correctly
