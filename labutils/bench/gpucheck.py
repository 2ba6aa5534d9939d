"""A prepared GPU check: ``python -m labutils.bench.gpucheck`` (``make gpu-check``).

On a machine with one NVIDIA GPU it runs, in a few minutes: the launcher on ``nccl`` with
``world_size=1`` (one all-reduce), training steps of a small GPT (``lu.models.CharGPT``) in
bf16, its model-FLOPs utilisation by PaLM's formula (Chowdhery et al. 2022, appendix B:
tokens/s x (6 N + 12 L H Q T) / peak, target >= 0.35), and the cost model's prediction of the
step (``lu.planner``, efficiency calibrated on Narayanan et al. 2021). It prints one table and
writes ``bench-results/gpucheck.{md,json}`` for the README. Without a CUDA device it says so
and exits cleanly (status 0): the course itself needs no GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from labutils.bench.suite import Row, markdown_table
from labutils.core.launcher import launch
from labutils.core.timing import Stats
from labutils.cost import planner
from labutils.data.models import CharGPT

# Dense bf16 tensor-core peaks (no sparsity), FLOP/s, from the vendors' data sheets.
PEAK_BF16 = {"H200": 989e12, "H100 SXM": 989e12, "H100 PCIe": 756e12, "H100": 989e12,
             "A100": 312e12, "A10G": 70e12, "A10": 125e12, "L40S": 362e12, "L4": 121e12,
             "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12, "T4": 65e12}


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 8
    n_embd: int = 2048
    n_head: int = 16
    seq_len: int = 1024
    vocab_size: int = 32768
    batch_size: int = 8
    steps: int = 10          # timed steps (after ``warmup``); the median is reported
    warmup: int = 3


def peak_flops(device_name):
    """bf16 peak of a GPU from its name (longest matching key), or None if unknown."""
    keys = sorted((k for k in PEAK_BF16 if k.lower() in device_name.lower()), key=len)
    return PEAK_BF16[keys[-1]] if keys else None


def palm_flops_per_token(num_params, cfg):
    """PaLM's model FLOPs per token: 6 N (matmuls, forward + backward) + 12 L H Q T
    (attention scores and values; H heads of size Q, so H Q = n_embd, over T positions)."""
    return 6 * num_params + 12 * cfg.n_layer * cfg.n_embd * cfg.seq_len


def train_steps(rank, world_size, cfg, device="cuda", dtype_name="bfloat16"):
    """Worker: one nccl (or gloo) all-reduce, then timed training steps of a GPT."""
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, dtype_name)
    probe = torch.ones(1024, device=device)
    dist.all_reduce(probe)  # the launcher's process group carries a collective
    torch.manual_seed(0)
    model = CharGPT(cfg.vocab_size, cfg.seq_len, cfg.n_embd, cfg.n_head, cfg.n_layer)
    model = model.to(device=device, dtype=dtype)
    # Embedding lookups are not matmuls: N counts the rest (blocks and the output head).
    num_params = sum(p.numel() for n, p in model.named_parameters() if "emb" not in n)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4,
                            fused=device == "cuda")
    x = torch.randint(cfg.vocab_size, (cfg.batch_size, cfg.seq_len), device=device)
    y = torch.roll(x, -1, dims=1)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    times, losses = [], []
    for i in range(cfg.warmup + cfg.steps):
        sync()
        t0 = time.perf_counter()
        logits = model(x)                                     # (B, T, vocab)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if i >= cfg.warmup:
            times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    name = torch.cuda.get_device_name(rank) if device == "cuda" else "cpu"
    mem = torch.cuda.max_memory_allocated(rank) if device == "cuda" else 0
    return dict(device=name, allreduce_ok=float(probe[0]) == world_size, times=times,
                num_params=num_params, losses=losses, max_memory=mem,
                backend=dist.get_backend())


def summarise(result, cfg, peak):
    """Rows of the table: measured step, MFU and the planner's prediction."""
    step = Stats.of(result["times"])
    tokens = cfg.batch_size * cfg.seq_len
    model_flops = tokens * palm_flops_per_token(result["num_params"], cfg)
    rows = [Row("gpucheck", "device", result["device"]),
            Row("gpucheck", f"launcher on {result['backend']}, world_size=1: all-reduce",
                "ok" if result["allreduce_ok"] else "WRONG RESULT"),
            Row("gpucheck", f"GPT {result['num_params'] / 1e6:.0f} M params, {tokens} tokens"
                f"/step: step time", step, "s"),
            Row("gpucheck", "loss first -> last step",
                f"{result['losses'][0]:.3f} -> {result['losses'][-1]:.3f}")]
    if peak is None:
        rows.append(Row("gpucheck", "MFU", "unknown peak", "", "pass --peak-tflops"))
        return rows
    mfu = Stats.of([model_flops / t / peak for t in result["times"]])
    rows.append(Row("gpucheck", "model FLOPs utilisation (PaLM)", mfu, "of peak",
                    f"peak {peak / 1e12:.0f} TFLOP/s bf16; target >= 0.35"))
    efficiency = planner.HARDWARE["A100-80GB"].efficiency
    transformer = planner.Transformer(cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.seq_len,
                                      cfg.vocab_size)
    predicted = transformer.iteration_flops(cfg.batch_size, recompute=False) / (peak * efficiency)
    rows.append(Row("gpucheck", "planner's predicted step time", predicted, "s",
                    f"efficiency {efficiency:.3f} (A100 default, fitted to Megatron-LM 145.6 B)"))
    rows.append(Row("gpucheck", "measured / predicted step",
                    Stats.of([t / predicted for t in step.values]), "ratio"))
    return rows


def no_gpu_message():
    return ("labutils.bench.gpucheck: no CUDA device found (torch.cuda.is_available() is False), so "
            "nothing was run. This check needs one NVIDIA GPU; the course's labs and tests run "
            "on CPU without one.")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m labutils.bench.gpucheck", description=__doc__)
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="bf16 peak of this GPU when its name is not in the table")
    parser.add_argument("--steps", type=int, default=GPTConfig.steps)
    parser.add_argument("--out", default="bench-results")
    args = parser.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print(no_gpu_message())
        return 0
    cfg = GPTConfig(steps=args.steps)
    result = launch(train_steps, cfg, world_size=1, backend="nccl", timeout=600)[0]
    peak = args.peak_tflops * 1e12 if args.peak_tflops else peak_flops(result["device"])
    rows = summarise(result, cfg, peak)
    table = markdown_table(rows)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpucheck.md"), "w") as f:
        f.write(f"### GPU check on {result['device']}\n\n{table}\n")
    with open(os.path.join(args.out, "gpucheck.json"), "w") as f:
        json.dump({"config": asdict(cfg), "result": {k: v for k, v in result.items()},
                   "rows": [r.as_dict() for r in rows],
                   "median_step_s": statistics.median(result["times"])}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
