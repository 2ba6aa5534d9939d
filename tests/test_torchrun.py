"""The 04b training script under torchrun: a killed worker is restarted and finishes from the
last checkpoint with exactly the weights of an undisturbed run."""
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _torchrun(tmp_path, name, *args):
    out = str(tmp_path / f"{name}.pt")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--max-restarts=1", "-m", "labutils.checkpoint",
           "--steps", "12", "--batch-size", "32", "--out", out, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return torch.load(out, weights_only=True), proc.stderr


@pytest.mark.lab04b
@pytest.mark.slow
def test_killed_worker_restarts_and_matches_undisturbed_run(tmp_path):
    undisturbed, _ = _torchrun(tmp_path, "undisturbed")
    ckpt = str(tmp_path / "ckpt")
    restarted, log = _torchrun(tmp_path, "restarted", "--ckpt-dir", ckpt, "--ckpt-every", "5",
                               "--kill-at-step", "7")
    # torchrun names the first failure it saw: the SIGKILLed rank, or the survivor that lost
    # its peer mid-all-reduce (whichever error came first)
    assert any(s in log for s in ("SIGKILL", "exitcode: -9", "Connection reset by peer",
                                  "Connection closed by peer")), log[-2000:]
    assert restarted["restart_count"] == 1  # the result comes from torchrun's second attempt
    assert restarted["start"] == 5          # which resumed from step_000005
    assert undisturbed["start"] == 0 and undisturbed["restart_count"] == 0
    for step in range(6, 13):
        assert restarted["losses"][step] == undisturbed["losses"][step], step
    for name, value in undisturbed["state"].items():
        assert torch.equal(restarted["state"][name], value), name
