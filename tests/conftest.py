"""Shared fixtures."""
import pytest
import torch


@pytest.fixture
def one_thread():
    """One intra-op thread: on a shared, busy 2-core machine two spinning threads per process
    make small models several times slower. Results do not depend on it."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
