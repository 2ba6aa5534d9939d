"""The 04a checkers name typical mistakes: PyTorch's bucket rule (no processes; mixed dtypes
included) and the one-message gradient sync, whose skipped-None mistake gets a message, not
a timeout."""
import pytest

import labutils as lu
from labutils.exercises import lab04a
from labutils.parallel.ddp import assign_buckets

pytestmark = pytest.mark.lab04a


@pytest.mark.parametrize("flags, words", [
    (dict(reach=False), "section 3's rule"),
    (dict(reverse=False), "registration order"),
    (dict(split_dtypes=False), "mixes dtypes"),
    (dict(per_dtype=False), "one open bucket per dtype"),
])
def test_bucket_checker_names_each_mistake(flags, words):
    result = lu.check_torch_buckets(lambda params, cap: lab04a._assign(params, cap, **flags))
    assert not result.passed and words in result.message


def test_bucket_checker_passes_the_reference_and_names_section_3s_rule():
    assert lu.check_torch_buckets(lab04a.torch_buckets).passed
    assert "section 3's rule" in lu.check_torch_buckets(assign_buckets).message
    other = lu.check_torch_buckets(lambda params, cap: [[p] for p in reversed(list(params))])
    assert not other.passed and "bucket 0 differs" in other.message
    assert "not implemented" in lu.check_torch_buckets(lambda params, cap: None).message


def test_reference_bucket_rule_is_pytorchs_on_mixed_dtypes():
    import torch
    import torch.distributed as dist
    for hidden in (16, 32, 64):
        for cap in (0.001, 0.004, 0.02, 0.07, 25.0):
            model = lu.ddp_equivalence.MixedNet(hidden=hidden, head_dtype=torch.float64)
            reverse = list(reversed(list(model.parameters())))
            indices, _ = dist._compute_bucket_assignment_by_size(reverse, [int(cap * 2**20)])
            ours = lab04a.torch_buckets(list(model.parameters()), cap)
            assert [[id(reverse[i]) for i in b] for b in indices] == [[id(p) for p in b] for b in ours]


def _skips_none(model):
    import torch
    import torch.distributed as dist
    params = [p for p in model.parameters() if p.grad is not None]   # the mistake
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    used = torch.ones(1)
    dist.all_reduce(used)
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for p, part in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(part.view_as(p))


@pytest.mark.slow
def test_sync_checker_names_the_skipped_none_mistake_without_a_timeout():
    result = lu.check_sync_gradients(_skips_none, timeout=30.0)
    assert not result.passed
    assert "different sizes" in result.message and "zeros" in result.message
    assert "deadlock" not in result.message


@pytest.mark.slow
def test_sync_checker_still_passes_the_reference():
    assert lu.check_sync_gradients(lab04a.sync_gradients).passed
