"""The idea of pipelining (05): cut the batch into micro-batches, so stage r works on
micro-batch i while stage r+1 works on micro-batch i-1. Forward only; the schedules with a
backward pass (GPipe, 1F1B) are ``labutils.parallel.pipeline`` (06a1).

A stage can only run ahead if handing a micro-batch on does not wait for the next stage. A gloo
``dist.send`` returns only once the receiver has posted the matching ``recv`` (its buffer is
the destination), so with ``send`` stage r waits, after each micro-batch, until stage r+1 has
finished its previous one. ``dist.isend`` returns at once; the transfer completes when the
receiver is ready, and we ``wait()`` on it at the end, before the tensor may be freed.
The idle share this leaves is measured from outside in ``labutils.experiments.microbatch_idle``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from labutils.core.i18n import tr
from labutils.parallel.model_parallel import StageLayout


def validate_microbatches(batch_size, n_microbatches):
    """Refuse a split into unequal micro-batches (each rank posts a recv of one fixed shape)."""
    if n_microbatches < 1 or batch_size % n_microbatches:
        options = [d for d in range(1, batch_size + 1) if batch_size % d == 0]
        raise ValueError(tr("a batch of {batch_size} samples cannot be split into {m} equal "
                            "micro-batches: use one of {options}", batch_size=batch_size,
                            m=n_microbatches, options=options))


def microbatched_forward(rank, world_size, stage, x_mbs, in_shape, blocking=False):
    """Forward of the micro-batches ``x_mbs`` through one stage per rank (``in_shape``: this
    stage's input for one micro-batch). ``blocking=True`` hands each output on with
    ``dist.send`` (stages cannot run ahead), else with ``dist.isend``. Returns the output of
    the whole batch on the last rank, else None."""
    layout = StageLayout(rank, world_size)
    outputs, sends = [], []
    with torch.no_grad():
        for i, x_mb in enumerate(x_mbs):
            if layout.pp_is_first_stage:
                stage_input = x_mb
            else:
                stage_input = torch.empty(in_shape)
                dist.recv(stage_input, src=layout.prev_rank, tag=i)
            out = stage(stage_input)
            if layout.pp_is_last_stage:
                outputs.append(out)
            elif blocking:
                dist.send(out, dst=layout.next_rank, tag=i)   # waits for rank + 1's recv
            else:
                sends.append(dist.isend(out, dst=layout.next_rank, tag=i))  # runs ahead
    for work in sends:
        work.wait()                                 # `out` must live until it is sent
    return torch.cat(outputs) if outputs else None
