"""labutils.data.workloads: each workload trains (its loss falls over a few steps), is deterministic
given a seed, and measures what it says (accuracy in 0..1, perplexity >= 1)."""
import math

import pytest
import torch

from labutils import workloads

pytestmark = [pytest.mark.lab03c, pytest.mark.usefixtures("one_thread")]


@pytest.mark.parametrize("name", workloads.NAMES)
def test_each_workload_trains_and_is_deterministic(name):
    wl = workloads.get(name)
    X, y = wl.train_set
    assert len(X) == len(y) and len(wl.test_set[0]) == len(wl.test_set[1])

    def run(seed):
        model = wl.make_model(seed)
        opt = wl.make_optimizer(model.parameters())
        xb, yb = X[:wl.batch_size], y[:wl.batch_size]
        losses = []
        for _ in range(12):  # one fixed batch: the loss must fall
            loss = wl.loss_fn(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, model

    losses, model = run(0)
    again, model2 = run(0)
    assert losses == again
    for p, q in zip(model.parameters(), model2.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert losses[-1] < 0.95 * losses[0], losses
    other, _ = run(1)
    assert other[0] != losses[0]  # another seed, other initial weights


def test_make_model_leaves_global_random_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    workloads.get("digits").make_model(7)
    torch.testing.assert_close(torch.rand(3), expected)


def test_metrics():
    digits = workloads.get("digits")
    acc = digits.metric(digits.make_model(0))
    assert 0.0 <= acc <= 0.3  # untrained: about chance (0.1)
    text = workloads.get("text")
    ppl = text.metric(text.make_model(0))
    # untrained: close to the vocabulary size (uniform guessing), certainly above 1
    assert 1 < ppl and abs(math.log(ppl) - math.log(98)) < 0.5
    assert not text.higher_is_better and digits.higher_is_better


def test_unknown_workload_names_the_choices():
    with pytest.raises(ValueError, match="digits, text, video"):
        workloads.get("audio")
