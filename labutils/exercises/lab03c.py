"""Exercise checkers of lab 03c: the statistics of the global batch (SyncBatchNorm). Registered in ``labutils.course``; notebooks call
them as ``lu.check_<name>``."""
import torch

from labutils.exercises.base import make_cases, run_check
from labutils.parallel.sync_batchnorm import sync_batch_stats  # noqa: F401 (the reference)


def _rank_batch(seed, rank, channels):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    n = 2 + (seed + 3 * rank) % 5                       # ranks hold different batch sizes
    return torch.randn(n, channels, generator=g) * (1 + rank) + rank  # and different statistics


def _sync_batch_stats_harness(rank, world_size, learner_fn, seed, channels):
    whole = torch.cat([_rank_batch(seed, r, channels) for r in range(world_size)])
    expected = (whole.mean(0), whole.var(0, unbiased=False))
    got = learner_fn(_rank_batch(seed, rank, channels))
    got = tuple(got[:2]) if isinstance(got, (tuple, list)) else got
    return expected, got


def check_sync_batch_stats(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(x) -> (mean, var)``: per-channel mean and biased variance of the
    batch made of every rank's ``x`` (ranks hold batches of different sizes)."""
    cases = make_cases(world_sizes=(2, 3, 4), per_world_size=1, seed=5, channels=[1, 3, 4])
    return run_check("sync_batch_stats", learner_fn, _sync_batch_stats_harness, cases,
                     timeout=timeout, atol=1e-5, rtol=1e-4)
