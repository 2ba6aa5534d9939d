"""The 04b accumulation checker names the equal-weights mistake (unequal micro-batch sizes
weighted equally) instead of only a differing gradient element."""
import pytest

import labutils as lu

pytestmark = [pytest.mark.lab04b, pytest.mark.slow]


def test_equal_weights_mistake_is_named():
    result = lu.check_no_sync_accumulation(lu.ddp_hooks.accumulate_with_no_sync)
    assert not result.passed
    assert "weight them equally" in result.message and "different numbers of samples" in result.message
    assert "element" not in result.message and "equal weights" not in result.message


def test_equal_weights_mistake_is_named_in_chinese():
    lu.set_language("zh")
    try:
        result = lu.check_no_sync_accumulation(lu.ddp_hooks.accumulate_with_no_sync)
    finally:
        lu.set_language("en")
    assert result.message.startswith("[错误] no_sync_accumulation：")
    assert "未通过（world_size=2, micro_batches=3" in result.message
    assert "一视同仁" in result.message and "rank 0" not in result.message
    assert "equal weights" not in result.message and "多出了键" not in result.message


def test_other_wrong_gradients_keep_the_element_message():
    def doubled(ddp_model, micro_batches, loss_fn):
        lu.exercises.lab04b.no_sync_accumulation(ddp_model, micro_batches,
                                                 lambda a, b: 2 * loss_fn(a, b))
    result = lu.check_no_sync_accumulation(doubled)
    assert not result.passed and "gradients" in result.message
    assert "weight them equally" not in result.message


def test_reference_passes():
    assert lu.check_no_sync_accumulation(lu.exercises.lab04b.no_sync_accumulation).passed
