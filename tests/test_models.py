"""labutils.data.models: output shapes, parameter counts the labs quote, causality of CharGPT."""
import pytest
import torch

import labutils as lu
from labutils import models

pytestmark = [pytest.mark.lab03c, pytest.mark.usefixtures("one_thread")]


def test_shapes_and_sizes():
    assert models.DigitsCNN()(torch.zeros(5, 1, 8, 8)).shape == (5, 10)
    assert models.CharGPT(98)(torch.zeros(3, 32, dtype=torch.int64)).shape == (3, 32, 98)
    assert models.ClipCNN3d()(torch.zeros(2, 1, 8, 16, 16)).shape == (2, 4)
    assert lu.memory.count_parameters(models.DigitsCNN()) == 38282
    assert lu.memory.count_parameters(models.CharGPT(98)) == 114402
    assert lu.memory.count_parameters(models.ClipCNN3d()) == 5748


def test_gpt_is_causal():
    """Changing a later token must not change the logits at earlier positions."""
    torch.manual_seed(0)
    gpt = models.CharGPT(20, block_size=8).eval()
    idx = torch.randint(20, (1, 8))
    changed = idx.clone()
    changed[0, 5] = (changed[0, 5] + 1) % 20
    a, b = gpt(idx), gpt(changed)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_gpt_refuses_long_sequences_and_generates():
    gpt = models.CharGPT(20, block_size=8)
    with pytest.raises(ValueError, match="block_size 8"):
        gpt(torch.zeros(1, 9, dtype=torch.int64))
    out = gpt.generate(torch.zeros(1, 3, dtype=torch.int64), 10,
                       generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, 13) and int(out.max()) < 20
    with pytest.raises(ValueError, match="divisible"):
        models.CharGPT(20, n_embd=30, n_head=4)
