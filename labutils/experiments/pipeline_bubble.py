"""The pipeline bubble measured (06a): timed runs of a schedule with known layer times, the
idle share of each rank, and a sweep over the number of micro-batches."""
from __future__ import annotations

import torch

from labutils.core.timeline import bubble_fraction, flatten
from labutils.cost.step_time import bubble_fraction as predicted_bubble
from labutils.parallel.pipeline import make_pipeline_mlp, run_pipeline


def measured_bubble(results):
    """Idle share of the last step's timeline over all ranks (``lu.timeline.bubble_fraction``)."""
    return bubble_fraction(flatten([r["spans"] for r in results]))


def makespan(results):
    spans = flatten([r["spans"] for r in results])
    return max(s.end for s in spans) - min(s.start for s in spans)


def timed_pipeline(world_size=4, n_microbatches=4, schedule="1f1b", batch_size=32,
                   ms_per_sample=0.25, layer_ms=None, sizes=None, n_layers=8, steps=2):
    """A pipeline whose layers sleep ``ms_per_sample`` per sample (forward; 2x backward).

    Equal deliberate work per layer makes a balanced pipeline whose bubble the formula should
    predict. Returns the per-rank results (their ``spans`` are the last step's timeline).
    """
    from functools import partial
    layer_ms = layer_ms if layer_ms is not None else [ms_per_sample] * n_layers
    model_fn = partial(make_pipeline_mlp, len(layer_ms), 16, 8, 4, layer_ms)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch_size, 8, generator=g), torch.randn(batch_size, 4, generator=g)
    return run_pipeline(model_fn, x, y, world_size=world_size, schedule=schedule,
                        n_microbatches=n_microbatches, sizes=sizes, steps=steps)


def microbatch_sweep(world_size=4, microbatches=(1, 2, 4, 8), schedule="1f1b", batch_size=32,
                     ms_per_sample=0.25, n_layers=8):
    """Measured vs predicted bubble and throughput for each number of micro-batches m.

    The ideal step time of a balanced pipeline is (m + p - 1) slots of one micro-batch's
    forward + backward on one stage: 3 * ms_per_sample * layers per stage * batch / m.
    """
    rows = []
    for m in microbatches:
        results = timed_pipeline(world_size, m, schedule, batch_size, ms_per_sample,
                                 n_layers=n_layers)
        slot = 3 * ms_per_sample / 1e3 * (n_layers / world_size) * batch_size / m
        rows.append({"m": m, "measured_bubble": measured_bubble(results),
                     "predicted_bubble": predicted_bubble(world_size, m),
                     "measured_throughput": batch_size / makespan(results),
                     "predicted_throughput": batch_size / ((m + world_size - 1) * slot)})
    return rows
