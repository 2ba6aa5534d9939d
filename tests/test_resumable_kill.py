"""train_script's kill knob fires only on the first ``kill_attempts`` attempts (04b uses
``kill_attempts=2`` under torchrun to use ``--max-restarts=1`` up)."""
import pytest

import labutils as lu

pytestmark = [pytest.mark.lab04b, pytest.mark.slow]


def test_kill_attempts_zero_never_kills():
    out = lu.launch(lu.resumable_training.train_script, steps=3, batch_size=32, kill_at_step=2,
                    kill_attempts=0, world_size=2, threads_per_rank=1)[0]
    assert out["restart_count"] == 0 and sorted(out["losses"]) == [1, 2, 3]


def test_default_kills_on_a_first_attempt():
    with pytest.raises(lu.WorkerError, match="SIGKILL"):
        lu.launch(lu.resumable_training.train_script, steps=3, batch_size=32, kill_at_step=2,
                  world_size=2, threads_per_rank=1)
