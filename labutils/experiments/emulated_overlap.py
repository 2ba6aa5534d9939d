"""What overlap buys when backward leaves the cores free (04c1 section 2b; emulated compute).

On a 2-core laptop, two ranks computing backward and gloo's communication thread share the same
cores, so launching buckets during backward hides little: the transfer takes cores from the
computation it should hide behind. On a GPU, backward's kernels run on the device and leave the
CPU thread and the network free. Here every layer's compute is **emulated**: the MLP's blocks
are followed by ``emulated_stages.Delay``, which sleeps in forward and backward (a sleeping rank
leaves the cores free), while the all-reduces are real gloo ones on a one-thread group. The
values and gradients are those of the real layers; only the time of compute is emulated.

Three variants, timed in paired rounds (``comm_spans.paired_rounds``):

* ``"overlapped"``: ``BucketedDDP``, each bucket launched as soon as its gradients are ready;
* ``"after backward"``: ``comm_spans.AfterBackwardDDP``, the same buckets sent after backward;
* ``"no_sync"``: the same model with ``require_backward_grad_sync = False`` (nothing sent).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labutils.core.i18n import N_
from labutils.experiments.comm_spans import AfterBackwardDDP, one_thread_group, paired_rounds
from labutils.parallel.ddp import BucketedDDP
from labutils.parallel.emulated_stages import make_pipeline_mlp


def emulated_mlp(depth=6, width=384, layer_ms=0.4):
    """``depth`` blocks Linear(width, width) + Tanh, each followed by a ``Delay`` of ``layer_ms``
    ms per sample forward (twice that backward): the emulated compute."""
    return make_pipeline_mlp(n_layers=depth, width=width, in_features=width, out_features=width,
                             layer_ms=[layer_ms] * depth)


def overlap_worker(rank, world_size, rounds=21, depth=6, width=384, layer_ms=0.4, batch=8,
                   bucket_cap_mb=0.5):
    """Per round, seconds of one step (zero_grad, forward, backward with its buckets) of the
    slowest rank for each variant: ``{variant: [seconds, ...]}``, paired; ``"buckets"`` (counted),
    ``"grad max diff"`` (overlapped against after backward after one step: 0.0, the same sums)
    and ``"backward sleep s"`` (the emulated backward compute of one step, as configured)."""
    group = one_thread_group()
    overlapped = BucketedDDP(emulated_mlp(depth, width, layer_ms), bucket_cap_mb=bucket_cap_mb,
                             group=group)
    after = AfterBackwardDDP(emulated_mlp(depth, width, layer_ms), bucket_cap_mb=bucket_cap_mb,
                             group=group)
    g = torch.Generator().manual_seed(rank)   # each rank its own shard of data
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)

    def step(m, sync):
        m.require_backward_grad_sync = sync
        m.zero_grad(set_to_none=True)
        F.mse_loss(m(x), y).backward()

    step(overlapped, True)
    step(after, True)
    diff = max((p.grad - q.grad).abs().max().item()
               for p, q in zip(overlapped.parameters(), after.parameters()))
    out = paired_rounds({N_("overlapped"): lambda: step(overlapped, True),
                         N_("after backward"): lambda: step(after, True),
                         "no_sync": lambda: step(overlapped, False)}, rounds)
    dist.barrier(group=group)
    return dict(out, buckets=len(overlapped.buckets), **{"grad max diff": diff,
                "backward sleep s": 2 * layer_ms * batch * depth / 1e3})
