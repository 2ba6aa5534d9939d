"""Data parallel training written from scratch, one step at a time (04a; used again in 04b, 04c).

Every rank computes gradients on its own shard of the batch; averaging those gradients over the
ranks gives exactly the gradient of the whole batch, so every replica takes the same step.

1. ``naive_allreduce_grads``: after ``backward()``, one blocking all-reduce per parameter.
2. ``HookedDDP``: one *asynchronous* all-reduce per parameter, started by a
   ``register_post_accumulate_grad_hook`` as soon as that gradient is ready during backward;
   ``wait()`` before ``optimizer.step()``.
3. ``BucketedDDP``: gradients packed into buckets of about ``bucket_cap_mb``, in reverse order of
   registration (roughly the order backward produces them), one asynchronous all-reduce per
   bucket, overlapping the rest of backward. As in PyTorch's ``DistributedDataParallel``
   (Li et al., VLDB 2020), the wait is queued at the end of backward: after ``loss.backward()``
   returns, every ``.grad`` already holds the average.

Unused parameters (a branch skipped in some steps): a parameter that no rank used keeps
``grad=None`` (the optimiser skips it); one used on some ranks only gets the average with zeros
from the others -- what ``DistributedDataParallel(find_unused_parameters=True)`` does.
``naive_allreduce_grads`` and ``BucketedDDP(find_unused_parameters=True)`` handle both cases;
``HookedDDP`` needs every rank to use the same parameters in a step (its per-parameter
all-reduces must be issued in the same order on every rank).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def naive_allreduce_grads(model, group=None):
    """Average every gradient over the ranks, one blocking all-reduce per parameter."""
    world_size = dist.get_world_size(group)
    params = [p for p in model.parameters() if p.requires_grad]
    # Which parameters got a gradient on any rank this step? (one small all-reduce)
    used = torch.tensor([float(p.grad is not None) for p in params])
    dist.all_reduce(used, group=group)
    for p, n_used in zip(params, used.tolist()):
        if n_used == 0:
            continue                        # unused everywhere: grad stays None, like DDP
        if p.grad is None:
            p.grad = torch.zeros_like(p)    # unused here, used elsewhere: contribute zeros
        dist.all_reduce(p.grad, group=group)  # sum over ranks ...
        p.grad /= world_size                   # ... divided by the world size: the mean


class HookedDDP(nn.Module):
    """Start each parameter's all-reduce the moment backward has produced its gradient."""

    def __init__(self, module, group=None):
        super().__init__()
        self.module, self.group = module, group
        self.world_size = dist.get_world_size(group)
        self.pending = []  # (param, async work) started during this backward
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p):
        work = dist.all_reduce(p.grad, group=self.group, async_op=True)
        self.pending.append((p, work))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def wait(self):
        """Wait for every all-reduce started in backward; call before ``optimizer.step()``."""
        for p, work in self.pending:
            work.wait()
            p.grad /= self.world_size
        self.pending = []


class _Bucket:
    """A flat buffer holding several gradients, all-reduced as one message.

    Offers what ``torch.distributed.GradBucket`` offers (``buffer``, ``index``, ``is_last``,
    ``parameters``, ``gradients``), so PyTorch's comm hooks run on it unchanged.
    """

    def __init__(self, index, params, last):
        self._index, self.params, self._last = index, params, last
        self.offsets, n = [], 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.flat = torch.zeros(n, dtype=params[0].dtype)
        self.expected, self.ready, self.future, self.active = set(), set(), None, []

    def buffer(self):
        return self.flat

    def index(self):
        return self._index

    def is_last(self):
        return self._last

    def parameters(self):
        return self.params

    def gradients(self):
        return [self.flat[o:o + p.numel()].view_as(p) for o, p in zip(self.offsets, self.params)]

    def nbytes(self):
        return self.flat.numel() * self.flat.element_size()


def allreduce_mean_hook(group, bucket):
    """The default comm hook: divide by the world size, then one async all-reduce (sum)."""
    tensor = bucket.buffer().div_(dist.get_world_size(group))
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def assign_buckets(params, bucket_cap_mb):
    """Split ``params`` (reverse registration order) into lists of about ``bucket_cap_mb``."""
    cap, buckets, current, size = bucket_cap_mb * 2**20, [], [], 0
    for p in reversed(list(params)):
        if current and (size + p.numel() * p.element_size() > cap or p.dtype != current[0].dtype):
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += p.numel() * p.element_size()
    return buckets + ([current] if current else [])


def used_parameters(outputs):
    """The leaf tensors that the autograd graph of ``outputs`` reaches (what backward will fill)."""
    if isinstance(outputs, torch.Tensor):
        outputs = [outputs]
    elif isinstance(outputs, dict):
        outputs = list(outputs.values())
    seen, found = set(), set()
    stack = [t.grad_fn for t in outputs if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):  # an AccumulateGrad node: a leaf parameter
            found.add(id(fn.variable))
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return found


class BucketedDDP(nn.Module):
    """Bucketed, overlapped gradient averaging: the design of ``DistributedDataParallel``.

    After ``loss.backward()`` returns, every ``.grad`` is the average over ranks. Buckets are
    all-reduced strictly in index order, so every rank issues the same sequence of collectives
    even when gradients become ready in a different order. ``require_backward_grad_sync =
    False`` skips the averaging (what DDP's ``no_sync()`` sets): ``.grad`` keeps local sums.
    """

    def __init__(self, module, bucket_cap_mb=25.0, group=None, find_unused_parameters=False):
        super().__init__()
        if bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be > 0 (e.g. 25.0); got {bucket_cap_mb}")
        self.module, self.group = module, group
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self.params = [p for p in module.parameters() if p.requires_grad]
        groups = assign_buckets(self.params, bucket_cap_mb)
        self.buckets = [_Bucket(i, ps, i == len(groups) - 1) for i, ps in enumerate(groups)]
        self.where = {}  # id(param) -> (bucket, position in bucket)
        for b in self.buckets:
            for i, p in enumerate(b.params):
                self.where[id(p)] = (b, i)
                p.register_post_accumulate_grad_hook(self._hook)
        self.comm_hook, self.comm_state = allreduce_mean_hook, group
        self._prepared = False
        with torch.no_grad():  # every replica starts from rank 0's weights, as DDP does
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0, group=group)

    def register_comm_hook(self, state, hook):
        """``hook(state, bucket) -> Future[Tensor]``, the signature of DDP's comm hooks."""
        self.comm_hook, self.comm_state = hook, state

    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self._prepare(out)
        return out

    def _prepare(self, out):
        """Before backward: which parameters will produce a gradient, bucket by bucket."""
        if self.find_unused_parameters:  # walk the graph, then agree across ranks
            used_here = [id(p) in ids for ids in [used_parameters(out)] for p in self.params]
            counts = torch.tensor(used_here, dtype=torch.float32)
            dist.all_reduce(counts, group=self.group)  # one tiny collective per step
            used_anywhere = (counts > 0).tolist()
        else:  # every parameter must produce a gradient (checked in wait)
            used_here = used_anywhere = [True] * len(self.params)
        for b in self.buckets:
            b.flat.zero_()
            b.ready, b.future, b.expected, b.active = set(), None, set(), []
        for p, anywhere, here in zip(self.params, used_anywhere, used_here):
            b, i = self.where[id(p)]
            if anywhere:
                b.expected.add(i)
                b.active.append(i)
                if not here:
                    b.ready.add(i)  # contributes the zeros already in its slot
        self.next_bucket, self._prepared, self._callback_queued = 0, True, False
        self._launch_ready()

    def _hook(self, p):
        if not self.require_backward_grad_sync:
            return                  # no_sync: .grad accumulates locally, nothing is sent
        if not self._prepared:
            raise RuntimeError("BucketedDDP: backward ran without a forward through the wrapper "
                               "(call ddp_model(x), not the inner module)")
        b, i = self.where[id(p)]
        b.gradients()[i].copy_(p.grad)
        b.ready.add(i)
        if not self._callback_queued:  # wait for all buckets once backward has finished
            torch.autograd.Variable._execution_engine.queue_callback(self.wait)
            self._callback_queued = True
        self._launch_ready()

    def _launch_ready(self):
        # In index order only: a later bucket that filled first waits for the earlier ones.
        while (self.next_bucket < len(self.buckets)
               and self.buckets[self.next_bucket].ready >= self.buckets[self.next_bucket].expected):
            b = self.buckets[self.next_bucket]
            if b.expected:
                b.future = self.comm_hook(self.comm_state, b)  # async: backward goes on
            self.next_bucket += 1

    def wait(self):
        """Wait for every bucket and copy the averages into ``.grad`` (idempotent)."""
        if not self._prepared:
            return
        if self.next_bucket < len(self.buckets):
            b = self.buckets[self.next_bucket]
            missing = [n for n, p in self.module.named_parameters()
                       if id(p) in {id(b.params[i]) for i in b.expected - b.ready}]
            raise RuntimeError(f"BucketedDDP: parameters {missing} got no gradient in this "
                               f"backward; pass find_unused_parameters=True if some steps skip "
                               f"them")
        for b in self.buckets:
            if b.future is None:
                continue
            reduced = b.future.wait()
            if reduced is not b.flat:
                b.flat.copy_(reduced)
            grads = b.gradients()
            for i in b.active:
                p = b.params[i]
                if p.grad is None:
                    p.grad = grads[i].clone()
                else:
                    p.grad.copy_(grads[i])
        self._prepared = False
