"""time_ddp_step (lab 03c): each case's compute and all-reduce timed apart, round by round, and
no collective inside a timed compute sample (DDP's bucket rebuild happens in the warm-up)."""
import contextlib

import pytest
from torch.nn.parallel import DistributedDataParallel as DDP

import labutils as lu
from labutils.core.commcount import count_collectives
from labutils.data import train

pytestmark = [pytest.mark.lab03c, pytest.mark.slow]


def _collectives_in_no_sync(rank, world_size, cases, repeats):
    """Run time_ddp_step with DDP.no_sync wrapped to count the collectives inside each block
    (the timed compute samples, and round 0's untimed one); also count everything."""
    original = DDP.no_sync
    per_block = []

    @contextlib.contextmanager
    def counting_no_sync(self):
        with count_collectives() as counted, original(self):
            yield
        per_block.append(dict(counted.by_op))

    DDP.no_sync = counting_no_sync      # this rank's process only
    try:
        with count_collectives() as everything:
            out = train.time_ddp_step(rank, world_size, cases, repeats=repeats)
    finally:
        DDP.no_sync = original
    return out, per_block, dict(everything.by_op)


def test_time_ddp_step_times_compute_and_allreduce_per_case_round_by_round():
    cases = {"digits": ("digits", None), "digits x2": ("digits", 128)}
    out = lu.launch(train.time_ddp_step, cases, repeats=3, world_size=2)
    for rank_out in out:
        assert set(rank_out) == set(cases)
        for case in rank_out.values():
            assert set(case) == {"compute", "allreduce", "grad_bytes"}
            assert case["grad_bytes"] == 38282 * 4          # DigitsCNN's float32 gradient
            assert case["compute"].n == case["allreduce"].n == 3
            assert case["compute"].median > 0 and case["allreduce"].median > 0
    single = lu.launch(train.time_ddp_step, "text", repeats=2, world_size=2)[0]
    assert set(single) == {"text"} and single["text"]["grad_bytes"] == 114402 * 4


def test_no_collective_falls_inside_a_timed_compute_sample():
    repeats = 3
    cases = {"digits": ("digits", None), "video": ("video", None)}
    for out, per_block, everything in lu.launch(_collectives_in_no_sync, cases, repeats,
                                                world_size=2):
        assert out["video"]["compute"].n == repeats
        # one no_sync block per case and round, warm-up round included
        assert len(per_block) == len(cases) * (repeats + 1)
        assert all(not block for block in per_block), per_block
        # the counter does see what a rebuild sends: the broadcasts happened, in the warm-up
        assert everything.get("broadcast_", 0) >= len(cases), everything
