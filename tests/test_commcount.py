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


def _powersgd_counts(rank, world_size):
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)))
    lu.ddp_hooks.register_hook(model, "powersgd")
    by_wrapper = lu.commcount.AllReduceBytes()
    for _ in range(lu.ddp_hooks.POWERSGD_WARMUP + 1):   # past the plain warm-up steps
        by_wrapper.calls = 0
        with lu.commcount.count_collectives() as by_dispatcher, by_wrapper:
            model(torch.randn(8, 32)).sum().backward()
    return by_dispatcher.all_reduces, by_wrapper.calls


@pytest.mark.slow
def test_ddp_hooks_counter_sees_calls_from_callbacks():
    # PowerSGD issues two of its three all-reduces from future callbacks, which run on gloo's
    # thread unless the future is already done: a dispatch mode is thread-local and then misses
    # them (here in most runs, not all), while AllReduceBytes replaces dist.all_reduce itself
    for by_dispatcher, by_wrapper in lu.launch(_powersgd_counts, world_size=2):
        assert by_wrapper == 3 and by_dispatcher <= by_wrapper, (by_dispatcher, by_wrapper)


def _calls(rank, world_size):
    with lu.commcount.count_collectives() as counted:
        dist.all_reduce(torch.ones(3))                                  # 12 bytes
        dist.all_reduce(torch.ones(5, dtype=torch.float64), async_op=True).wait()   # 40 bytes
        if rank == 0:
            dist.send(torch.ones(7), 1)                                 # 28 bytes to rank 1
        else:
            dist.recv(torch.empty(7), 0)
        dist.all_to_all_single(torch.empty(4), torch.ones(4))           # 16 bytes in
    # gloo's point-to-point works have no future: their completion is not seen (None)
    return [(c.op, c.nbytes, c.group_size, c.peer, None if c.completed is None
             else c.completed >= c.launched) for c in counted.calls], counted.sent_bytes


@pytest.mark.slow
def test_each_call_records_its_payload_peer_and_both_clocks():
    (r0, sent0), (r1, sent1) = lu.launch(_calls, world_size=2)
    assert r0 == [("allreduce_", 12, 2, None, True), ("allreduce_", 40, 2, None, True),
                  ("send", 28, 2, 1, None), ("alltoall_base_", 16, 2, None, True)]
    assert r1[2] == ("recv_", 28, 2, 0, None)
    assert (sent0, sent1) == (28, 0)


def _uneven_all_to_all(rank, world_size):
    # rank 0 sends 1 row to itself and 3 to rank 1; rank 1 sends 2 rows each way (rows of 2 floats)
    send = [1, 3] if rank == 0 else [2, 2]
    recv = [1, 2] if rank == 0 else [3, 2]
    with lu.commcount.count_collectives() as counted:
        dist.all_to_all_single(torch.empty(sum(recv), 2), torch.ones(4, 2), recv, send)
        # the list form, one tensor per peer (gloo's needs equal sizes): 3 rows of 2 floats each
        dist.all_to_all([torch.empty(3, 2) for _ in range(2)], [torch.ones(3, 2) for _ in range(2)])
    return [(c.group_rank, c.send_split_bytes, c.recv_split_bytes, c.off_rank_bytes)
            for c in counted.calls]


@pytest.mark.slow
def test_all_to_all_records_its_split_sizes_and_the_bytes_for_other_ranks():
    r0, r1 = lu.launch(_uneven_all_to_all, world_size=2)
    assert r0[0] == (0, [8, 24], [8, 16], 24)      # its own row stays: 24 bytes leave rank 0
    assert r1[0] == (1, [16, 16], [24, 16], 16)
    assert r0[1] == (0, [24, 24], [24, 24], 24) and r1[1] == (1, [24, 24], [24, 24], 24)
