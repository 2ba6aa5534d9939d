"""Step times of each parallelism on a link, from the alpha-beta collectives of ``costmodel``:
data parallel (with buckets and overlap), pipeline (with its bubble), tensor parallel, ZeRO;
and the speedup they give over one rank (04c, 07)."""
from __future__ import annotations

from dataclasses import dataclass

from labutils.cost.costmodel import (
    all_gather_time,
    allreduce_time,
    get_link,
    reduce_scatter_time,
    send_recv_time,
)


@dataclass(frozen=True)
class StepTime:
    """Seconds of one training step, split the way a timeline shows it."""
    compute: float          # arithmetic on this device
    comm: float             # communication, all of it
    exposed_comm: float     # the part of ``comm`` not hidden behind compute
    bubble: float = 0.0     # pipeline fill and drain: the device waits

    @property
    def total(self):
        return self.compute + self.exposed_comm + self.bubble


def _link_ab(link):
    link = get_link(link)
    return link.alpha, link.beta


def _overlapped(compute, comm, overlap, backward_share=2 / 3):
    """Communication launched during backward can hide behind it, at most ``overlap`` of it."""
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap is a fraction in [0, 1]; got {overlap!r}")
    return comm - min(comm, overlap * backward_share * compute)


def data_parallel_step(compute_s, grad_bytes, world_size, link, overlap=0.0, num_buckets=1,
                       algorithm="ring"):
    """DDP: each rank computes ``compute_s`` then all-reduces ``grad_bytes`` in buckets.

    Each bucket pays its own latency terms. With ``overlap=1`` buckets travel during backward
    (taken as 2/3 of compute), one after another as they fill (Li et al. 2020): the first can
    only leave once 1/num_buckets of backward has run, and the last is filled when backward
    ends, so at least one bucket's all-reduce is always exposed. One bucket hides nothing.
    """
    alpha, beta = _link_ab(link)
    b = int(num_buckets)
    if b < 1:
        raise ValueError(f"num_buckets must be >= 1; got {num_buckets!r}")
    comm = b * allreduce_time(grad_bytes / b, world_size, alpha, beta, algorithm)
    window = compute_s * (1 - 1 / b)          # backward after the first bucket has filled
    exposed = max(comm / b, _overlapped(window, comm, overlap))
    return StepTime(compute_s, comm, exposed)


def exposed_comm(ready, comm, backward_end):
    """Seconds a step waits after backward for its buckets, when one communication thread runs
    them one at a time in order (gloo with one thread, 04c1): bucket b is ready ``ready[b]``
    seconds into backward and its all-reduce takes ``comm[b]`` seconds; backward ends at
    ``backward_end``. Unlike ``data_parallel_step`` the buckets may differ in size and fill at
    any time."""
    free = 0.0                        # when the thread can take the next bucket
    for r, c in zip(ready, comm, strict=True):
        free = max(free, r) + c       # a bucket starts once it is ready and the thread is free
    return max(0.0, free - backward_end)   # what ran before backward's end was hidden


def pipeline_step(compute_s, num_stages, num_microbatches, activation_bytes, link):
    """GPipe/1F1B: ``compute_s`` of the whole model on one device, cut into p equal stages.

    Per micro-batch and stage: compute ``compute_s / (p m)`` plus two messages (activation
    forward, its gradient backward) of ``alpha + n beta``. The schedule runs m + p - 1 such
    slots, so the bubble share is (p-1)/(m+p-1), latency included.
    """
    p, m = int(num_stages), int(num_microbatches)
    if p < 1 or m < 1:
        raise ValueError(f"num_stages and num_microbatches must be >= 1; got {p}, {m}")
    alpha, beta = _link_ab(link)
    slot_compute = compute_s / (p * m)
    slot_comm = 2 * send_recv_time(activation_bytes, 2, alpha, beta) if p > 1 else 0.0
    slot = slot_compute + slot_comm
    return StepTime(m * slot_compute, m * slot_comm, m * slot_comm, (p - 1) * slot)


def bubble_fraction(num_stages, num_microbatches):
    """Idle share of a GPipe/1F1B pipeline: (p-1)/(m+p-1)."""
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


def tensor_parallel_step(compute_s, tp_world_size, num_layers, activation_bytes, link,
                         algorithm="ring", recompute=False):
    """Megatron TP: compute splits t ways; each layer all-reduces its activations 4 times
    (2 forward: after attention and MLP; 2 backward: their input gradients), not overlapped;
    6 times with activation recomputation, which repeats the forward pass."""
    alpha, beta = _link_ab(link)
    per_layer = 6 if recompute else 4
    comm = per_layer * num_layers * allreduce_time(activation_bytes, tp_world_size, alpha, beta,
                                                   algorithm)
    return StepTime(compute_s / tp_world_size, comm, comm)


def zero_step(compute_s, num_params, world_size, stage, link, bytes_per_param=2, overlap=0.0,
              algorithm="ring"):
    """ZeRO/FSDP data parallelism: stages 0-2 move what an all-reduce moves (reduce-scatter of
    gradients + all-gather of parameters); stage 3 gathers parameters again for backward:
    1.5x (Rajbhandari et al. 2020, section 7)."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3; got {stage!r}")
    alpha, beta = _link_ab(link)
    n = num_params * bytes_per_param
    comm = (reduce_scatter_time(n, world_size, alpha, beta, algorithm)
            + all_gather_time(n, world_size, alpha, beta, algorithm) * (2 if stage == 3 else 1))
    return StepTime(compute_s, comm, _overlapped(compute_s, comm, overlap))


def speedup(one_rank_s, step, world_size):
    """Weak scaling: ``world_size`` ranks each do one rank's batch in ``step.total`` seconds,
    where one rank alone takes ``one_rank_s``; the samples-per-second ratio."""
    return world_size * one_rank_s / step.total
