"""Benchmark ``zero``: bytes held per rank by each ZeRO stage against the formula."""
from labutils.bench.suite import Row
from labutils.cost.planspec import zero_state_bytes
from labutils.experiments.zero_training import KINDS, make_problem, run_training


def run(quick=False):
    """Per-rank memory of each ZeRO stage and FSDP2: measured peak vs the paper's formula."""
    sizes = (64,) + (128,) * 6 + (8,)
    psi = sum(p.numel() for p in make_problem(sizes)[0].parameters())
    rows = []
    for world_size in (2,) if quick else (2, 4):
        for kind in KINDS:
            res = run_training(kind, world_size, sizes=sizes, batch=16, steps=2,
                               measure_memory=True)
            formula = zero_state_bytes(psi, world_size, 3 if kind == "fsdp" else KINDS[kind])
            peak = max(res["peak_bytes_per_rank"])
            rows.append(Row("zero", f"{kind}, {world_size} ranks: measured peak / formula",
                            peak / formula, "ratio",
                            f"peak {peak / 2**20:.3f} MiB, model-state formula "
                            f"{formula / 2**20:.3f} MiB, psi={psi}"))
    return rows
