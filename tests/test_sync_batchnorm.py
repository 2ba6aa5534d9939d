"""labutils.parallel.sync_batchnorm: equal to single-process BatchNorm on the whole batch."""
import pytest
import torch
from torch import nn

import labutils as lu
from labutils import sync_batchnorm as S

from .checkers import assert_check, checker_cases

pytestmark = pytest.mark.lab03e1


def _whole_batch(world_size, shape, seed=0):
    """Every rank's shard (different sizes and statistics), rebuilt in one process."""
    shards = []
    for r in range(world_size):
        g = torch.Generator().manual_seed(seed * 10 + r)
        n = 3 + 2 * r
        shards.append(torch.randn(n, *shape, generator=g, dtype=torch.float64) * (1 + r) + r)
    return shards


def _compare(rank, world_size, shape, affine):
    """In float64: the ranks sum their shards and then each other's sums, one process sums the
    whole batch, so the orders differ. Reordering a sum of n <= 100 terms errs by at most
    n * 2**-53 * sum|terms| (Higham 4.2), ~1e-14 relative here, so assert_close's float64
    tolerances (rtol 1e-7, atol 1e-7) hold on any CPU: a difference beyond them is a bug."""
    import torch.distributed as dist
    shards = _whole_batch(world_size, shape)
    C = shape[0]
    bn_cls = {1: nn.BatchNorm1d, 2: nn.BatchNorm1d, 3: nn.BatchNorm2d}[len(shape)]
    torch.manual_seed(0)
    ref = bn_cls(C, affine=affine).double()
    if affine:  # not the default 1 and 0, so that weight and bias matter
        with torch.no_grad():
            ref.weight.uniform_(0.5, 1.5), ref.bias.uniform_(-1, 1)
    sync = S.SyncBatchNorm.convert(nn.Sequential(bn_cls(C, affine=affine)))[0].double()
    sync.load_state_dict(ref.state_dict())
    up = torch.randn(sum(len(s) for s in shards), *shape,
                     generator=torch.Generator().manual_seed(7),
                     dtype=torch.float64)  # an upstream gradient
    # single process, whole batch
    whole = torch.cat(shards).requires_grad_(True)
    out_ref = ref(whole)
    (out_ref * up).sum().backward()
    # this rank, its shard
    start = sum(len(s) for s in shards[:rank])
    rows = slice(start, start + len(shards[rank]))
    x = shards[rank].clone().requires_grad_(True)
    for _ in range(2):  # twice: the running statistics carry over correctly
        x.grad = None
        for p in sync.parameters():
            p.grad = None
        out = sync(x)
        (out * up[rows]).sum().backward()
    out_ref2 = ref(whole)  # the reference's second step, for running stats and output
    torch.testing.assert_close(out, out_ref2[rows].detach())
    torch.testing.assert_close(x.grad, whole.grad[rows])
    torch.testing.assert_close(sync.running_mean, ref.running_mean)
    torch.testing.assert_close(sync.running_var, ref.running_var)
    assert int(sync.num_batches_tracked) == int(ref.num_batches_tracked) == 2
    if affine:  # weight/bias grads are local shares: their sum over ranks is the whole grad
        for p, q in zip(sync.parameters(), ref.parameters()):
            g = p.grad.clone()
            dist.all_reduce(g)
            torch.testing.assert_close(g, q.grad)
    sync.eval(), ref.eval()
    torch.testing.assert_close(sync(shards[rank]), ref(shards[rank]))
    return True


@pytest.mark.slow
@pytest.mark.parametrize("world_size,shape,affine", [(2, (3,), True), (3, (2, 4, 4), True),
                                                      (2, (4, 5), False)])
def test_sync_batchnorm_equals_batchnorm_on_whole_batch(world_size, shape, affine):
    assert lu.launch(_compare, shape, affine, world_size=world_size,
                     warn_oversubscription=False) == [True] * world_size


def test_single_process_is_plain_batchnorm():
    torch.manual_seed(0)
    x = torch.randn(8, 3)
    ref, sync = nn.BatchNorm1d(3), S.SyncBatchNorm(3)
    torch.testing.assert_close(sync(x), ref(x))
    with pytest.raises(ValueError, match="momentum"):
        S.SyncBatchNorm(3, momentum=None)


def _mean_of_means(x):
    """Typical mistake: averages the ranks' means, wrong when batch sizes differ."""
    import torch.distributed as dist
    m, v = x.mean(0), x.var(0, unbiased=False)
    dist.all_reduce(m), dist.all_reduce(v)
    return m / dist.get_world_size(), v / dist.get_world_size()


def _local_only(x):
    """Typical mistake: no communication at all (plain BatchNorm's statistics)."""
    return x.mean(0), x.var(0, unbiased=False)


def _unbiased(x):
    """Typical mistake: the global batch's sums, but divided by n - 1 (torch.var's default)."""
    import torch.distributed as dist
    C = x.shape[1]
    stats = torch.cat([x.sum(0), (x * x).sum(0), torch.tensor([float(len(x))])])
    dist.all_reduce(stats)
    n = stats[-1]
    mean = stats[:C] / n
    return mean, (stats[C:2 * C] - n * mean * mean) / (n - 1)


def _stub(x):
    raise NotImplementedError  # FILL ME IN


@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(lambda x: S.sync_batch_stats(x)[:2], {
    "mean_of_means": (_mean_of_means, ("for 'mean'", "mean of ranks' means", "unequal batch")),
    "local_only": (_local_only, ("for 'mean'", "this rank's only", "all-reduce")),
    "unbiased": (_unbiased, ("for 'variance'", "unbiased (n-1)", "divides by n")),
    "stub": (_stub, "not implemented"),
}))
def test_checker_accepts_reference_and_rejects_mistakes(answer, verdict):
    assert_check(lu.check_sync_batch_stats, answer, verdict)


def test_convert_keeps_the_layers_dtype_and_state():
    bn = nn.BatchNorm1d(3).double()
    bn.running_mean += 1.5
    sync = S.SyncBatchNorm.convert(nn.Sequential(bn))[0]
    assert isinstance(sync, S.SyncBatchNorm)
    assert sync.weight.dtype == sync.running_mean.dtype == torch.float64
    assert torch.equal(sync.running_mean, bn.running_mean)
    assert isinstance(sync.weight, nn.Parameter) and sync.weight.requires_grad
