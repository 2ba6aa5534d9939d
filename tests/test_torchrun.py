"""torchrun: the 04b training script with a killed worker restarts and finishes from the last
checkpoint with exactly the weights of an undisturbed run; the README's multi-node command,
run as two nodes on this machine, trains exactly as ``lu.launch`` does, and so does 06e's
composed step (README, "Running the composed lab on a cluster"). No port is picked
before it is bound: ``--standalone`` binds port 0 in torchrun's own store, and the two nodes'
rendezvous store listens here, on 127.0.0.1 port 0."""
import os
import socket
import subprocess
import sys

import pytest
import torch
from torch.distributed import TCPStore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _torchrun(tmp_path, name, *args):
    out = str(tmp_path / f"{name}.pt")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--max-restarts=1", "-m", "labutils.core.run",
           "labutils.experiments.resumable_training:train_script",
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


# ---- two nodes: the README's multi-node command, run as two torchrun agents on this machine --

def _readme_multinode_command(marker="multinode"):
    """The command between the README's ``marker`` markers, as one line."""
    import re
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    block = re.search(rf"<!-- {marker}:start -->\n(.*?)<!-- {marker}:end -->", text, re.S)
    assert block, f"README.md lost its <!-- {marker}:start/end --> block"
    return " ".join(line.strip().rstrip("\\").strip() for line in block.group(1).splitlines())


def _loopback_store():
    """A TCPStore server listening on 127.0.0.1 only, on a port the OS picked as it bound."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        return TCPStore("127.0.0.1", sock.getsockname()[1], is_master=True,
                        wait_for_workers=False, master_listen_fd=sock.detach())


def _run_two_agents(words, tmp_path, result_name):
    """Run the README command ``words`` as two torchrun agents on this machine (node ranks 0
    and 1, rendezvous on a loopback store); return what global rank 0 saved."""
    store = _loopback_store()
    port = store.port
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run"]
        for w in words[1:]:
            w = w.replace("HOST:29400", f"127.0.0.1:{port}")
            w = "--node-rank=1" if w == "--node-rank=0" and node == 1 else w
            cmd.append(str(tmp_path / f"node{node}.pt") if w == result_name else w)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for node, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"node {node}:\n{out[-3000:]}"
    # only global rank 0 saves; c10d rendezvous gives it to whichever agent joined first
    saved = [tmp_path / f"node{n}.pt" for n in (0, 1) if (tmp_path / f"node{n}.pt").exists()]
    assert len(saved) == 1, saved
    return torch.load(saved[0], weights_only=False)


@pytest.mark.lab04b
@pytest.mark.slow
def test_two_nodes_with_c10d_rendezvous_match_launch(tmp_path):
    import shlex

    import labutils as lu
    from labutils import train
    words = shlex.split(_readme_multinode_command())
    assert words[0] == "torchrun" and "--node-rank=0" in words and "HOST:29400" in " ".join(words)
    # The rendezvous store is hosted here, on a socket bound to 127.0.0.1 port 0 and handed to
    # the store already listening: a port picked first and bound later by an agent could be
    # taken in between, and a TCPStore that binds by itself listens on every interface (::).
    # Both agents find 127.0.0.1:port taken and join it as clients (torch's c10d backend tries
    # to host an endpoint of this machine, then falls back to joining it).
    two_nodes = _run_two_agents(words, tmp_path, "result.pt")
    launched = lu.launch(train.train_worker, steps=20, world_size=2, threads_per_rank=1)[0]
    assert two_nodes.losses == launched.losses
    for name, value in launched.state_dict.items():
        assert torch.equal(two_nodes.state_dict[name], value), name


@pytest.mark.lab06e
@pytest.mark.slow
def test_composed_worker_on_two_nodes_matches_launch(tmp_path):
    """06e's dp=2 x tp=2 x pp=2 step, as the README's cluster command: two agents of 4 ranks,
    the mesh spanning both (each holds one pipeline stage), equal to lu.launch rank by rank
    and to one process."""
    import shlex

    import labutils as lu
    from labutils.experiments import composed_runs as C
    from labutils.parallel.composed import composed_worker
    words = shlex.split(_readme_multinode_command("composed-multinode"))
    assert words[0] == "torchrun" and "--nproc-per-node=4" in words
    two_nodes = _run_two_agents(words, tmp_path, "composed.pt")
    dims = two_nodes.dims
    assert dims == lu.parallel_dims.ParallelDims(dp=2, tp=2, pp=2)
    assert len(two_nodes.ranks) == 8
    x, y = C.make_batch()
    launched = lu.launch(composed_worker, dims, x, y, world_size=8, threads_per_rank=1,
                         warn_oversubscription=False)
    for rank, (ours, theirs) in enumerate(zip(two_nodes.ranks, launched)):
        assert ours["coords"] == theirs["coords"] == dims.coords(rank).as_dict()
        assert ours["losses"] == theirs["losses"], rank
        for what in ("grads", "params"):
            assert ours[what].keys() == theirs[what].keys()
            for name, value in theirs[what].items():
                assert torch.equal(ours[what][name], value), (rank, what, name)
    C.assert_equal_to_one_process(two_nodes.ranks, dims)
    assert two_nodes.losses() == pytest.approx(C.reference_train(x, y)["losses"], rel=1e-9)
