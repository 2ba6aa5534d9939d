"""labutils.data.train: the reference loop is deterministic; global batches, shards and loss weights
partition a batch exactly; 2-rank DDP (train_worker) ends with the same weights and losses as one
process on the whole batch, for every workload, also when the batch does not split evenly; the
shard_batch checker accepts the reference and names what is wrong in typical mistakes."""
import dataclasses

import pytest
import torch

import labutils as lu
from labutils import train, workloads
from labutils.exercises import lab03c

from .checkers import assert_check, checker_cases

pytestmark = [pytest.mark.lab03c, pytest.mark.usefixtures("one_thread")]


def test_global_batches_are_seeded_epochs():
    batches = train.global_batches(10, 4, steps=5, seed=0)
    assert [len(b) for b in batches] == [4] * 5
    # Two full batches per epoch (the last 2 samples dropped), no repeats inside an epoch.
    assert len(set(torch.cat(batches[:2]).tolist())) == 8
    assert len(set(torch.cat(batches[2:4]).tolist())) == 8
    again = train.global_batches(10, 4, steps=5, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(batches, again))
    other = train.global_batches(10, 4, steps=5, seed=1)
    assert not all(torch.equal(a, b) for a, b in zip(batches, other))
    with pytest.raises(ValueError, match="batch_size must be in 1..10"):
        train.global_batches(10, 11, steps=1)


@pytest.mark.parametrize("n,world_size", [(8, 2), (7, 2), (10, 3), (3, 3)])
def test_shards_partition_the_batch_and_weights_average_to_one(n, world_size):
    batch = torch.arange(n)
    parts = [train.shard(batch, r, world_size) for r in range(world_size)]
    assert torch.equal(torch.cat(parts), batch)
    weights = [train.shard_weight(n, r, world_size) for r in range(world_size)]
    # weight_r = world_size * n_r / n, so the weights average to exactly 1
    assert sum(weights) / world_size == pytest.approx(1.0)
    assert [w * n / world_size for w in weights] == pytest.approx([len(p) for p in parts])


def test_reference_loop_is_deterministic_and_learns():
    a = train.train("digits", steps=30, seed=0, eval_every=30)
    b = train.train("digits", steps=30, seed=0, eval_every=30)
    assert a.losses == b.losses and a.metrics == b.metrics
    for k in a.state_dict:
        torch.testing.assert_close(a.state_dict[k], b.state_dict[k], rtol=0, atol=0)
    assert a.losses[-1] < 0.5 * a.losses[0]
    assert a.metrics[0][0] == 30 and a.metrics[0][1] > 0.5
    c = train.train("digits", steps=3, seed=1)
    assert c.losses[0] != a.losses[0]


def test_bad_arguments_are_refused_in_the_caller():
    with pytest.raises(ValueError, match="choose one of digits, text, video"):
        train.validate_train_args("speech")
    with pytest.raises(ValueError, match="use batch_size >= 4"):
        train.validate_train_args("digits", batch_size=3, world_size=4)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        train.validate_train_args("digits", steps=0)


def _float64(name):
    """Workload ``name`` with its model and data in float64 (targets and token ids unchanged)."""
    wl = workloads.get(name)

    def to64(t):
        return t.double() if t.is_floating_point() else t
    return dataclasses.replace(wl, build_model=lambda: wl.build_model().double(),
                               train_set=tuple(map(to64, wl.train_set)),
                               test_set=tuple(map(to64, wl.test_set)))


@pytest.mark.slow
@pytest.mark.parametrize("name,batch_size", [("digits", 63), ("text", 16), ("video", 32)])
def test_two_rank_ddp_equals_one_process_on_the_whole_batch(name, batch_size):
    """In float64. Each rank sums its shard's gradients, DDP sums the two ranks, one process sums
    the whole batch: the orders differ, and in float32 so do the last bits, by the CPU's math
    library. Reordering a sum of n <= 64 terms errs by at most n * 2**-53 * sum|terms| (Higham
    4.2), ~1e-14 relative; four SGD steps (momentum 0.9) carry that forward about linearly, far
    below assert_close's float64 tolerances (rtol 1e-7, atol 1e-7). A wrong loss weight on the
    uneven shards (32 and 31 of 63) is off by ~1/63 relative."""
    kwargs = dict(steps=4, batch_size=batch_size, seed=3)
    wl = _float64(name)
    reference = train.train(wl, **kwargs)
    results = lu.launch(train.train_worker, wl, world_size=2, **kwargs)
    for result in results:
        torch.testing.assert_close(result.losses, reference.losses)
        assert result.state_dict.keys() == reference.state_dict.keys()
        for key, expected in reference.state_dict.items():
            torch.testing.assert_close(result.state_dict[key], expected, msg=key)


@pytest.mark.slow
def test_time_ddp_step_reports_compute_and_allreduce():
    out = lu.launch(train.time_ddp_step, "digits", repeats=2, world_size=2)
    for rank_out in out:
        assert set(rank_out["digits"]) == {"compute", "allreduce", "grad_bytes"}
        assert rank_out["digits"]["grad_bytes"] == 38282 * 4
        assert rank_out["digits"]["compute"].n == 2 and rank_out["digits"]["compute"].median > 0


# ---- the shard_batch exercise -------------------------------------------------------------

def chunk_without_weight(batch, rank, world_size):
    return batch.chunk(world_size)[rank], 1.0         # wrong when the batch does not divide


def drops_the_remainder(batch, rank, world_size):
    per_rank = len(batch) // world_size
    return batch[rank * per_rank:(rank + 1) * per_rank], 1.0


def strided_without_weight(batch, rank, world_size):
    return batch[rank::world_size], 1.0


def stub(batch, rank, world_size):
    # FILL ME IN
    raise NotImplementedError


def weight_too_large(batch, rank, world_size):
    return torch.tensor_split(batch, world_size)[rank], 2.0


def delegates_the_weight(batch, rank, world_size):
    return batch.tensor_split(world_size)[rank], lu.train.shard_weight(len(batch), rank, world_size)


PLAIN_AVERAGE = ["a plain average over-weights the smaller shard", "depends on the size of this shard"]


@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", checker_cases(lab03c.shard_batch, {
    "chunk_without_weight": (chunk_without_weight, ["for 'loss weight'", *PLAIN_AVERAGE]),
    "drops_the_remainder": (drops_the_remainder, "sample 6 on no rank"),
    "strided_without_weight": (strided_without_weight, ["for 'loss weight'", *PLAIN_AVERAGE]),
    "weight_too_large": (weight_too_large, "2: too large for 4 of 7 samples on 2 ranks"),
    "delegates_the_weight": (delegates_the_weight, "calls the library's shard_weight"),
    "delegates_the_answer": (lambda b, r, w: train.shard_batch(b, r, w), "library's shard_batch"),
    "stub": (stub, "not implemented yet"),
}, passes="passed"))
def test_check_shard_batch_accepts_the_reference_and_rejects_typical_mistakes(answer, verdict):
    result = assert_check(lu.check_shard_batch, answer, verdict)
    assert "1.14" not in result.message  # never the answer (8/7 for n=7 on 2 ranks, rank 0)
    assert "..." not in result.message   # its words shown whole


def test_the_exercise_reference_agrees_with_the_library():
    for n, world_size in [(7, 2), (10, 3), (6, 3)]:
        for rank in range(world_size):
            mine, weight = lab03c.shard_batch(torch.arange(n), rank, world_size)
            assert torch.equal(mine, train.shard(torch.arange(n), rank, world_size))
            assert weight == pytest.approx(train.shard_weight(n, rank, world_size))


@pytest.mark.slow
def test_train_to_file_saves_the_reference_losses(tmp_path):
    """The worker 02's launcher map starts under torchrun and mp.spawn (here under lu.launch)."""
    out = str(tmp_path / "losses.pt")
    last = lu.launch(train.train_to_file, out, "digits", steps=3, world_size=2)
    saved = torch.load(out, weights_only=True)
    reference = train.train("digits", steps=3)
    torch.testing.assert_close(torch.tensor(saved), torch.tensor(reference.losses))
    assert last == [round(saved[-1], 3)] * 2
