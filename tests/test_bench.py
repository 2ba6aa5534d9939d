"""The benchmark suite runs end to end (``--quick``) and writes its table; no speed asserted."""
import json
import os
import subprocess
import sys

import pytest

from labutils.bench import suite as bench
from labutils.core.timing import Stats

pytestmark = pytest.mark.lab07
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_rows_render_as_markdown_and_json():
    rows = [bench.Row("x", "a / b", Stats.of([1.0, 2.0, 3.0]), "ratio", "note"),
            bench.Row("x", "count", 3.0), bench.Row("x", "FAILED", "ValueError: boom")]
    table = bench.markdown_table(rows).splitlines()
    assert len(table) == 2 + len(rows) and table[2].startswith("| x | a / b | 2 (min 1, max 3)")
    assert rows[0].as_dict()["value"] == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}


def test_write_results_files(tmp_path):
    rows = [bench.Row("x", "a / b", Stats.of([1.0, 2.0]), "ratio")]
    bench.write_results(rows, {"x": 1.5}, str(tmp_path), quick=True)
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["quick"] is True and data["seconds"] == {"x": 1.5}
    assert data["rows"][0]["value"]["median"] == 1.5 and "cores" in data["machine"]
    for name in ("bench.md", "README-snippet.md"):
        text = (tmp_path / name).read_text()
        assert "| x | a / b |" in text and data["machine"] in text


def test_unknown_benchmark_is_refused_before_running(capsys):
    with pytest.raises(SystemExit):
        bench.main(["no-such-benchmark"])
    assert "choose from all" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_suite_runs_every_registered_benchmark(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "labutils.bench", "all", "--quick",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    data = json.loads((out / "bench.json").read_text())
    failed = [r for r in data["rows"] if r["figure"] == "FAILED"]
    assert not failed, f"benchmarks failed: {failed}"
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert set(data["seconds"]) == set(bench.BENCHMARKS)
    assert {r["benchmark"] for r in data["rows"]} == set(bench.BENCHMARKS)
    for r in data["rows"]:
        assert r["figure"] and isinstance(r["value"], (dict, float, int, str))
        v = r["value"]
        if isinstance(v, dict) and "ratio" in v:     # a paired ratio with its 95% interval
            lo, hi = v["ci95"]                       # nan: too few rounds (--quick) for 95%
            assert len(v["n"]) in (1, 2) and (lo != lo or lo <= v["ratio"] <= hi)
        elif isinstance(v, dict):
            assert v["min"] <= v["median"] <= v["max"]
    table = (out / "bench.md").read_text()
    assert table.count("\n| ") == len(data["rows"]) + 1  # header + one line per row
    assert data["machine"] in proc.stdout


# ---- the GPU check ------------------------------------------------------------------------------

def test_gpucheck_without_cuda_exits_cleanly_with_a_message(monkeypatch, capsys):
    import torch

    from labutils.bench import gpucheck
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpucheck.main([]) == 0
    out = capsys.readouterr().out
    assert "no CUDA device" in out and "nothing was run" in out


@pytest.mark.slow
def test_gpucheck_module_entry_point_without_cuda():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "labutils.bench.gpucheck"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "no CUDA device" in proc.stdout


def test_gpucheck_peaks_and_palm_formula():
    from labutils.bench import gpucheck as g
    assert g.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert g.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert g.peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert g.peak_flops("NVIDIA A10G") == 70e12
    assert g.peak_flops("Some Future GPU") is None
    cfg = g.GPTConfig(n_layer=2, n_embd=64, seq_len=32)
    assert g.palm_flops_per_token(1000, cfg) == 6 * 1000 + 12 * 2 * 64 * 32


@pytest.mark.slow
def test_gpucheck_step_and_table_on_cpu():
    """The same worker and table on CPU/gloo with a tiny GPT (a GPU is not needed to test it)."""
    import labutils as lu
    from labutils.bench import gpucheck as g
    cfg = g.GPTConfig(n_layer=2, n_embd=32, n_head=4, seq_len=16, vocab_size=64, batch_size=2,
                      steps=3, warmup=1)
    result = lu.launch(g.train_steps, cfg, "cpu", "float32", world_size=1, backend="gloo")[0]
    assert result["allreduce_ok"] and len(result["times"]) == 3
    assert result["losses"][-1] < result["losses"][0]  # training on one batch: loss falls
    rows = g.summarise(result, cfg, peak=1e12)
    figures = [r.figure for r in rows]
    assert "model FLOPs utilisation (PaLM)" in figures and "measured / predicted step" in figures
    mfu = rows[figures.index("model FLOPs utilisation (PaLM)")].value
    assert 0 < mfu.median < 1
    assert g.summarise(result, cfg, peak=None)[-1].value == "unknown peak"
