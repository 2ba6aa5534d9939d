"""labutils.core.memory: the memory formula against the measured peak of a real training step;\nLiveBytes, the peak counted from the storages ops make (views, resizes, frees on another thread)."""
import functools

import pytest
import torch
import torch.nn as nn

import labutils as lu
from labutils import memory

pytestmark = pytest.mark.lab03e2

# The formula's stated tolerance: measured peak within 20 % of the predicted total.
TOLERANCE = 0.20


def _batch(n, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_measure_peak_counts_live_tensors_exactly():
    def work():
        a = torch.empty(1000)                # 4000 bytes live
        b = torch.empty(500)                 # +2000 -> 6000, the peak
        del a, b
        return torch.empty(10)               # 40 bytes live at the end

    result, peak = memory.measure_peak(work)
    assert result.shape == (10,)
    assert peak == 6000


def test_measure_peak_is_deterministic():
    x, y = _batch(64, (32,))
    make = functools.partial(lu.models.mlp, (32, 64, 10))
    peaks = [memory.measure_peak(memory.train_steps, make, x, y, "adam")[1] for _ in range(2)]
    assert peaks[0] == peaks[1] > 0


def test_live_bytes_counts_storages_made_inside_until_they_die():
    before = torch.empty(1000)               # made before the block: not counted

    def work():
        a = torch.empty(1000)                # 4000 bytes live
        b = a.view(10, 100).add_(1)          # a view and an in-place result: no new storage
        c = torch.empty(500)                 # +2000 -> 6000, the peak
        del a, b, c
        before.mul_(2)                       # touched, but made before the block
        return torch.empty(10)               # 40 bytes live at the end

    with memory.LiveBytes() as live:
        result = work()
    assert result.shape == (10,)
    assert (live.peak, live.now) == (6000, 40)
    assert memory.live_peak(work)[1] == 6000


def test_live_bytes_sees_storage_resized_and_freed_on_another_thread():
    import threading
    held, dropped = [], threading.Event()

    def work():
        t = torch.empty(1000)                # 4000
        t.untyped_storage().resize_(0)       # freed as FSDP2 frees a gathered weight
        u = torch.empty(250)                 # 1000 live: the resized storage counts 0
        held.append(u)
        del u
        threading.Thread(target=lambda: (held.clear(), dropped.set())).start()
        dropped.wait()                       # the last reference died on the other thread
        return torch.empty(100)              # 400 live

    with memory.LiveBytes() as live:
        result = work()
    assert (live.peak, live.now) == (4000, result.nbytes)
    del result
    assert live.now == 0                     # read after the block too: what is still alive


def test_live_peak_repeats_and_is_at_most_the_allocators_peak():
    x, y = _batch(64, (32,))
    make = functools.partial(lu.models.mlp, (32, 64, 10))
    peaks = [memory.live_peak(memory.train_steps, make, x, y, "adam")[1] for _ in range(2)]
    est = memory.model_memory(make(), optimizer="adam")
    assert peaks[0] == peaks[1] >= est["weights"] + est["gradients"] + est["optimizer"]
    # the allocator also hears an op's scratch, which tensors never hold
    assert peaks[0] <= memory.measure_peak(memory.train_steps, make, x, y, "adam")[1]


def test_formula_terms():
    model = lu.models.mlp((10, 20, 5))          # 10*20+20 + 20*5+5 = 325 parameters
    est = memory.model_memory(model, optimizer="adam")
    assert est["parameters"] == 325
    assert est["weights"] == est["gradients"] == 325 * 4
    assert est["optimizer"] == 325 * 4 * 2
    assert est["activations"] == 0
    half = memory.model_memory(model, optimizer="sgd", dtype_bytes=2)
    assert half["weights"] == 325 * 2 and half["optimizer"] == 325 * 4  # fp32 master copy
    mom = memory.model_memory(model, optimizer="momentum")
    assert mom["optimizer"] == 325 * 4


def test_activations_of_a_linear_layer_is_its_input():
    model = nn.Sequential(nn.Linear(16, 8))
    x = torch.randn(32, 16, requires_grad=False)
    # A Linear layer saves its input (32 x 16 fp32) for the weight gradient; nothing else.
    assert memory.activation_bytes(model, x) == 32 * 16 * 4
    est = memory.model_memory(model, example_input=x, batch=64)
    assert est["activations"] == 64 * 16 * 4


def _cnn():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 16, 10))


@pytest.mark.parametrize("case", ["mlp-adam-weights", "mlp-sgd-activations", "cnn-adam"])
def test_formula_matches_measured_peak(case):
    torch.manual_seed(0)
    if case == "mlp-adam-weights":      # weights and Adam state dominate
        make, (x, y), opt = functools.partial(lu.models.mlp, (64, 512, 512, 10)), _batch(32, (64,)), "adam"
    elif case == "mlp-sgd-activations":  # activations dominate
        make, (x, y), opt = functools.partial(lu.models.mlp, (64, 128, 128, 10)), _batch(1024, (64,)), "sgd"
    else:
        make, (x, y), opt = _cnn, _batch(128, (1, 8, 8)), "adam"
    est, peak = memory.formula_vs_peak(make, x, y, opt)
    ratio = peak / est["total"]
    assert 1 - TOLERANCE <= ratio <= 1 + TOLERANCE, (case, est, peak)
    # and the persistent terms alone never exceed what was measured
    assert est["weights"] + est["gradients"] + est["optimizer"] <= peak


def test_bad_optimizer_named():
    with pytest.raises(ValueError, match="adam"):
        memory.model_memory(lu.models.mlp(), optimizer="adagrad")
    with pytest.raises(ValueError, match="example_input"):
        memory.model_memory(lu.models.mlp(), batch=8)


# ---- a whole step under PyTorch's default zero_grad (set_to_none=True) ---------------------

def _mlp_case():
    return functools.partial(lu.models.mlp, (64, 512, 512, 512, 10)), _batch(512, (64,))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_step_formula_under_the_default_matches_measured_peak(optimizer):
    make, (x, y) = _mlp_case()
    torch.manual_seed(0)
    default = memory.step_memory(make(), optimizer, example_input=x)
    kept = memory.step_memory(make(), optimizer, example_input=x, set_to_none=False)
    assert kept == {**memory.model_memory(make(), optimizer, example_input=x), "phase": "backward"}
    assert default["total"] == sum(default[t] for t in memory.TERMS)
    # gradients and activations never all coexist: fewer bytes than the kept sum
    assert default["gradients"] + default["activations"] < kept["gradients"] + kept["activations"]
    assert default["total"] < kept["total"]
    est, peak = memory.formula_vs_peak(make, x, y, optimizer, set_to_none=True)
    assert est == default
    assert 1 - TOLERANCE <= peak / est["total"] <= 1 + TOLERANCE, (est, peak)
    _, peak_kept = memory.formula_vs_peak(make, x, y, optimizer)
    # the measured peaks differ by at least half what the formulas say they differ by
    assert peak_kept - peak > 0.5 * (kept["total"] - default["total"])


def test_step_formula_finds_the_optimizer_step_when_weights_dominate():
    # a wide MLP on a small batch: the peak is in Adam's step (every gradient, no activation)
    make, (x, _) = functools.partial(lu.models.mlp, (64, 1024, 1024, 10)), _batch(16, (64,))
    est = memory.step_memory(make(), "adam", example_input=x)
    assert est["phase"] == "optimizer step" and est["activations"] == 0
    assert est["gradients"] == est["weights"]


def test_train_steps_default_keeps_the_old_zero_grad():
    make, (x, y) = _mlp_case()
    torch.manual_seed(0)
    a = memory.train_steps(make, x[:32], y[:32], "sgd")
    torch.manual_seed(0)
    b = memory.train_steps(make, x[:32], y[:32], "sgd", set_to_none=True)
    assert a == b                      # the same losses: zeroed or None, the next step is equal
