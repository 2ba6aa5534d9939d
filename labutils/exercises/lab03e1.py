"""Exercise checkers of lab 03e1: the statistics of the global batch (SyncBatchNorm).
Registered in ``labutils.course``; notebooks call them as ``lu.check_<name>``."""
import torch

from labutils.core.i18n import tr
from labutils.exercises.base import make_cases, run_check
from labutils.parallel.sync_batchnorm import sync_batch_stats  # noqa: F401 (the reference)


def _ok():
    """What a right mean and a right variance are, in words (composed on the ranks)."""
    return tr("of every rank's samples"), tr("biased, of every rank's samples")


def _rank_batch(seed, rank, channels):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    n = 2 + (seed + 3 * rank) % 5                       # ranks hold different batch sizes
    return torch.randn(n, channels, generator=g) * (1 + rank) + rank  # and different statistics


def _matches(got, candidate):
    return (isinstance(got, torch.Tensor) and got.shape == candidate.shape
            and torch.allclose(got.double(), candidate.double(), atol=1e-5, rtol=1e-4))


def _diagnose(got, right, mistakes):
    """``right`` when ``got`` matches the reference or no known mistake; else the mistake's
    words (messages are cut at 60 characters: each says what is wrong in fewer)."""
    if _matches(got, mistakes[0][0]):
        return right
    return next((words for value, words in mistakes[1:] if _matches(got, value)), right)


def _sync_batch_stats_harness(rank, world_size, learner_fn, seed, channels):
    batches = [_rank_batch(seed, r, channels) for r in range(world_size)]
    whole, mine = torch.cat(batches), batches[rank]
    mean, var = whole.mean(0), whole.var(0, unbiased=False)
    mean_ok, var_ok = _ok()
    mean_key, var_key, values = tr("mean"), tr("variance"), tr("values")
    expected = {mean_key: mean_ok, var_key: var_ok, values: (mean, var)}
    got = learner_fn(mine.clone())
    got = tuple(got[:2]) if isinstance(got, (tuple, list)) and len(got) >= 2 else got
    if not isinstance(got, tuple):
        return expected, {mean_key: mean_ok, var_key: var_ok, values: got}
    # the typical mistakes, in words; anything else is reported by its numbers ("values")
    means = torch.stack([b.mean(0) for b in batches]).mean(0)
    variances = torch.stack([b.var(0, unbiased=False) for b in batches]).mean(0)
    return expected, {
        mean_key: _diagnose(got[0], mean_ok, [
            (mean, None), (mine.mean(0), tr("this rank's only: all-reduce the sums")),
            (means, tr("mean of ranks' means: wrong for unequal batch sizes"))]),
        var_key: _diagnose(got[1], var_ok, [
            (var, None),
            (mine.var(0, unbiased=False), tr("this rank's only: all-reduce x*x sums")),
            (whole.var(0, unbiased=True), tr("unbiased (n-1): BatchNorm divides by n")),
            (variances, tr("mean of ranks' variances: use E[x^2] - mean^2"))]),
        values: got}


def check_sync_batch_stats(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(x) -> (mean, var)``: per-channel mean and biased variance of the
    batch made of every rank's ``x`` (ranks hold batches of different sizes)."""
    cases = make_cases(world_sizes=(2, 3, 4), per_world_size=1, seed=5, channels=[1, 3, 4])
    return run_check("sync_batch_stats", learner_fn, _sync_batch_stats_harness, cases,
                     timeout=timeout, atol=1e-5, rtol=1e-4)
