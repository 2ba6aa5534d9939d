"""lab 03e2's checker: ``check_model_states`` accepts the reference, names each typical mistake;
the reference agrees with the course's formula and with the bytes a real step allocates."""
import pytest
import torch

import labutils as lu
from labutils.exercises import lab03e2 as exercises

pytestmark = pytest.mark.lab03e2

K = {"sgd": 0, "momentum": 1, "adam": 2}


def _no_gradients(n, opt, b):
    return n * (b + 4 * (K[opt] + (b < 4)))


def _state_in_dtype(n, opt, b):
    return n * (2 * b + b * (K[opt] + (b < 4)))


def _no_master(n, opt, b):
    return n * (2 * b + 4 * K[opt])


def _always_master(n, opt, b):
    return n * (2 * b + 4 * (K[opt] + 1))


def _adam_one_state(n, opt, b):
    return n * (2 * b + 4 * (min(K[opt], 1) + (b < 4)))


def _stub(n, opt, b):
    raise NotImplementedError  # FILL ME IN


def test_reference_passes_and_equals_the_course_formulas():
    result = exercises.check_model_states(exercises.model_states)
    assert result.passed, result.message
    assert "7 cases passed" in result.message
    model = lu.models.mlp((64, 32, 10))
    for opt in K:
        est = lu.memory.model_memory(model, optimizer=opt, dtype_bytes=2)
        n = est["parameters"]
        assert exercises.model_states(n, opt, 2) == est["weights"] + est["gradients"] + est["optimizer"]
        assert exercises.model_states(n, opt, 4) == exercises.counted_model_states((64, 32, 10), opt)
    assert exercises.model_states(10 ** 6, "adam", 2) == lu.planspec.zero_memory_per_gpu(10 ** 6, 1, 0)


@pytest.mark.parametrize("answer, words", [
    (_no_gradients, "the gradients are missing"),
    (_state_in_dtype, "are fp32 (4 bytes)"),
    (_no_master, "fp32 master copy"),
    (_always_master, "needs no master copy"),
    (_adam_one_state, "Adam keeps two fp32 values"),
    (_stub, "not implemented"),
    (lambda n, opt, b: "many", "expected a number of bytes"),
    (lambda n, opt, b: 1 / 0, "raised ZeroDivisionError"),
])
def test_typical_mistakes_are_named(answer, words):
    result = exercises.check_model_states(answer)
    assert not result.passed
    assert words in result.message, result.message


def test_sgd_with_a_momentum_buffer_is_named():
    result = exercises.check_model_states(lambda n, opt, b: n * (2 * b + 4 * (opt != "sgd") * 2
                                                                    + 4 * (opt == "sgd")))
    assert not result.passed and "SGD keeps no state" in result.message, result.message


def test_not_a_function():
    with pytest.raises(TypeError, match="my_model_states"):
        exercises.check_model_states(42)
