"""labutils.core.commcount: collectives are counted where they are issued, blocking or not,
including the bucket all-reduces of PyTorch's DDP."""
import pytest
import torch
import torch.distributed as dist

import labutils as lu

pytestmark = pytest.mark.lab04a


def _issue(rank, world_size, blocking, non_blocking):
    with lu.commcount.count_collectives() as counted:
        for _ in range(blocking):
            dist.all_reduce(torch.ones(3))
        works = [dist.all_reduce(torch.ones(2), async_op=True) for _ in range(non_blocking)]
        for work in works:
            work.wait()
        dist.barrier()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    with lu.commcount.count_collectives() as in_ddp:
        model(torch.randn(3, 4)).sum().backward()
    return counted.all_reduces, counted.total, in_ddp.all_reduces


@pytest.mark.slow
def test_every_all_reduce_is_counted_and_nothing_else():
    for all_reduces, total, in_ddp in lu.launch(_issue, 3, 2, world_size=2):
        assert all_reduces == 5          # 3 blocking + 2 async
        assert total == 6                # and the barrier, counted apart
        assert in_ddp == 1               # one bucket: DDP's reducer goes through the dispatcher


def test_counting_outside_a_process_group_counts_nothing():
    with lu.commcount.count_collectives() as counted:
        torch.ones(3).sum()
    assert counted.total == 0 and counted.all_reduces == 0
