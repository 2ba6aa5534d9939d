"""Shared fixtures, and the rule behind ``make test-fast``: a test that starts a process (a
rank, a kernel, torchrun, a server) is marked ``slow``; an unmarked one that tries fails."""
import multiprocessing.process
import subprocess

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


class ProcessStartedInFastTest(AssertionError):
    pass


@pytest.fixture(scope="session", autouse=True)
def _font_cache():
    """matplotlib builds its font cache on first use, running ``fc-list``: on a fresh machine
    that would be a process started inside whichever fast test draws first. Build it here,
    before any test runs."""
    import matplotlib.font_manager
    matplotlib.font_manager.findfont("DejaVu Sans")


@pytest.fixture(autouse=True)
def _no_processes_unless_slow(request, monkeypatch):
    """Tests not marked ``slow`` run in ``make test-fast``, which starts no process: starting
    one (multiprocessing, subprocess, so also lu.launch and torchrun) fails the test here,
    so a missing mark is caught in every run, not only when somebody times test-fast."""
    if request.node.get_closest_marker("slow") is not None:
        return

    def refuse(*args, **kwargs):
        raise ProcessStartedInFastTest(
            f"{request.node.nodeid} starts a process: mark it @pytest.mark.slow")
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
