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

import contextlib
import os
import sys
import time

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

    ``BucketedDDP(module, bucket_cap_mb=25.0, group=None)``; after ``loss.backward()`` returns,
    every parameter's ``.grad`` is the average over ranks (no extra call needed). Buckets are
    all-reduced strictly in index order, so every rank issues the same sequence of collectives
    even when gradients become ready in a different order. ``timeline`` (a ``lu.timeline
    .Timeline``) records one ``allreduce`` span per bucket, from launch to completion.
    """

    def __init__(self, module, bucket_cap_mb=25.0, group=None, find_unused_parameters=False,
                 timeline=None):
        super().__init__()
        if bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be > 0 (e.g. 25.0); got {bucket_cap_mb}")
        self.module, self.group, self.timeline = module, group, timeline
        self.find_unused_parameters = find_unused_parameters
        self.params = [p for p in module.parameters() if p.requires_grad]
        groups = assign_buckets(self.params, bucket_cap_mb)
        self.buckets = [_Bucket(i, ps, i == len(groups) - 1) for i, ps in enumerate(groups)]
        self.where = {}  # id(param) -> (bucket, position in bucket)
        for b in self.buckets:
            for i, p in enumerate(b.params):
                self.where[id(p)] = (b, i)
                p.register_post_accumulate_grad_hook(self._hook)
        self.comm_hook, self.comm_state = allreduce_mean_hook, group
        self.num_allreduces = 0  # buckets launched since construction (for the notebooks)
        self.bytes_reduced = 0
        self._prepared = False
        with torch.no_grad():  # every replica starts from rank 0's weights, as DDP does
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0, group=group)

    def register_comm_hook(self, state, hook):
        """``hook(state, bucket) -> Future[Tensor]``, the signature of DDP's comm hooks."""
        self.comm_hook, self.comm_state = hook, state

    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        if torch.is_grad_enabled():
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
        while (self.next_bucket < len(self.buckets)
               and self.buckets[self.next_bucket].ready >= self.buckets[self.next_bucket].expected):
            b = self.buckets[self.next_bucket]
            if b.expected:
                start = time.perf_counter()
                b.future = self.comm_hook(self.comm_state, b)
                if self.timeline is not None:
                    b.future = b.future.then(self._recorder(b, start))
                self.num_allreduces += 1
                self.bytes_reduced += b.nbytes()
            self.next_bucket += 1

    def _recorder(self, b, start):
        def done(fut):  # runs on the communication thread the moment the bucket is reduced
            self.timeline.add("allreduce", start, time.perf_counter(), label=f"b{b.index()}",
                              nbytes=b.nbytes())
            return fut.value()
        return done

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


# ---- a small model of mixed parameter sizes, and the runs every version is checked with ----

class MixedNet(nn.Module):
    """Parameters from 1 to 16k numbers; ``aux`` is used only when ``use_aux`` is true."""

    def __init__(self, d_in=16, hidden=64, d_out=4):
        super().__init__()
        self.embed = nn.Linear(d_in, hidden)         # 1024 + 64
        self.scale = nn.Parameter(torch.ones(1))     # a single number
        self.big = nn.Linear(hidden, 4 * hidden)     # 16384 + 256
        self.head = nn.Linear(4 * hidden, d_out)     # 1024 + 4
        self.aux = nn.Linear(hidden, d_out)          # skipped in some steps

    def forward(self, x, use_aux=True):
        h = torch.relu(self.embed(x)) * self.scale   # (B, hidden)
        out = self.head(torch.relu(self.big(h)))     # (B, d_out)
        return out + self.aux(h) if use_aux else out


def make_batches(steps, batch_size, d_in=16, d_out=4, seed=0):
    """Deterministic regression batches: a list of (X, y), the same in every process."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch_size, d_in, generator=g), torch.randn(batch_size, d_out, generator=g))
            for _ in range(steps)]


def uses_aux(step, rank=0, pattern="even"):
    """Which steps use the ``aux`` branch: on even steps ("even"), or only on rank 0 ("rank0")."""
    return step % 2 == 0 if pattern == "even" else rank == 0


@contextlib.contextmanager
def _silence_stderr(enabled=True):
    """Send this process's file descriptor 2 (C++ warnings too) to /dev/null for a while."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def train_reference(steps=4, batch_size=12, seed=0, lr=0.1, aux_pattern="even", world_size=2):
    """Single process, whole batch: the result every data-parallel version must reproduce."""
    torch.manual_seed(seed)
    model = MixedNet()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    shard = batch_size // world_size
    for step, (X, y) in enumerate(make_batches(steps, batch_size, seed=seed + 1)):
        progress(step + 1, steps, "steps")  # rank 0 drives a panel's bar
        opt.zero_grad()
        if aux_pattern == "even":
            loss = nn.functional.mse_loss(model(X, use_aux=uses_aux(step)), y)
        else:  # the aux branch runs on rank 0's shard only: the mean of the per-shard losses
            loss = sum(nn.functional.mse_loss(model(X[r * shard:(r + 1) * shard],
                                                    use_aux=uses_aux(step, r, aux_pattern)),
                                              y[r * shard:(r + 1) * shard])
                       for r in range(world_size)) / world_size
        loss.backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def train_data_parallel(rank, world_size, version="bucketed", steps=4, batch_size=12, seed=0,
                        lr=0.1, aux_pattern="even", bucket_cap_mb=0.02, sync=None):
    """Train MixedNet on this rank's shard with one DDP version; return final weights and counts.

    ``version``: "naive", "hooks", "bucketed", "torch" (``DistributedDataParallel``) or
    "custom" with ``sync(model)`` called after backward (an exercise's learner function).
    """
    torch.manual_seed(seed)
    model = MixedNet()
    counts = {"allreduces": 0}
    if version == "hooks":
        wrapped = HookedDDP(model)
    elif version == "bucketed":
        wrapped = BucketedDDP(model, bucket_cap_mb=bucket_cap_mb, find_unused_parameters=True)
    elif version == "torch":
        wrapped = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb,
                                                      find_unused_parameters=True)
    else:
        wrapped = model
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    shard = batch_size // world_size
    # DDP's C++ side warns, with a timestamp, on each step that uses every parameter although
    # find_unused_parameters=True; expected here, so it is kept out of the notebooks' output
    with _silence_stderr(version == "torch"):
        for step, (X, y) in enumerate(make_batches(steps, batch_size, seed=seed + 1)):
            progress(step + 1, steps, "steps")  # rank 0 drives a panel's bar
            X, y = X[rank * shard:(rank + 1) * shard], y[rank * shard:(rank + 1) * shard]
            opt.zero_grad()
            loss = nn.functional.mse_loss(wrapped(X, use_aux=uses_aux(step, rank, aux_pattern)), y)
            loss.backward()
            if version == "naive":
                naive_allreduce_grads(model)
            elif version == "hooks":
                counts["allreduces"] += len(wrapped.pending)
                wrapped.wait()
            elif version == "custom":
                sync(model)
            opt.step()
    if version == "naive":
        counts["allreduces"] = steps * (1 + len(list(model.parameters())))
    elif version == "bucketed":
        counts["allreduces"] = wrapped.num_allreduces
    return {n: p.detach().clone() for n, p in model.named_parameters()}, counts


# ---- exercise checkers (lu.check_sync_gradients, lu.check_assign_buckets) -----------------

def _sync_gradients_harness(rank, world_size, learner_fn, seed, aux_pattern):
    expected = train_reference(steps=3, batch_size=6 * world_size, seed=seed,
                               aux_pattern=aux_pattern, world_size=world_size)
    got, _ = train_data_parallel(rank, world_size, "custom", steps=3, batch_size=6 * world_size,
                                 seed=seed, aux_pattern=aux_pattern, sync=learner_fn)
    return expected, got


def check_sync_gradients(learner_fn, *, timeout=60.0):
    """Check ``learner_fn(model)``, called after ``backward()`` on every rank: three SGD steps
    must give the weights of single-process training on the whole batch, including steps where
    the ``aux`` branch is unused on every rank or on some ranks only."""
    from .exercises import make_cases, run_check
    cases = make_cases(world_sizes=(2, 3), per_world_size=1, seed=4, aux_pattern=["even"])
    cases += make_cases(world_sizes=(2,), per_world_size=1, seed=5, aux_pattern=["rank0"])
    return run_check("sync_gradients", learner_fn, _sync_gradients_harness, cases,
                     timeout=timeout)


def _assign_buckets_harness(rank, world_size, learner_fn, seed, bucket_cap_mb):
    torch.manual_seed(seed)
    model = MixedNet(hidden=[16, 32, 64][seed % 3])
    names = {id(p): n for n, p in model.named_parameters()}
    expected = [[names[id(p)] for p in b] for b in assign_buckets(model.parameters(),
                                                                   bucket_cap_mb)]
    got = [[names.get(id(p), "?") for p in b]
           for b in learner_fn(list(model.parameters()), bucket_cap_mb)]
    return expected, got


def check_assign_buckets(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(params, bucket_cap_mb) -> list of lists of parameters``: buckets of
    at most ``bucket_cap_mb`` MiB (a bigger parameter gets a bucket of its own), filled in
    reverse order of registration."""
    from .exercises import make_cases, run_check
    cases = make_cases(world_sizes=(2,), per_world_size=3, seed=1,
                       bucket_cap_mb=[0.001, 0.004, 0.02, 0.07, 25.0])
    return run_check("assign_buckets", learner_fn, _assign_buckets_harness, cases,
                     timeout=timeout)


# ---- step time and all-reduce calls of each version, side by side (04a) -----------------------

def time_versions(rank, world_size, hidden=256, batch_size=128, repeats=5, bucket_cap_mb=0.5,
                  versions=("naive", "hooks", "bucketed", "torch")):
    """Time one training step of every version, interleaved (A B C D A B C D ...), on MixedNet
    of width ``hidden``. Returns ``{version: (Stats of seconds per step, all-reduces per step)}``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from .timing import Stats
    torch.manual_seed(0)
    X = torch.randn(batch_size // world_size, 16)
    y = torch.randn(batch_size // world_size, 4)
    steps = {}
    for v in versions:
        model = MixedNet(hidden=hidden)
        if v == "naive":
            steps[v] = (model, lambda m=model: naive_allreduce_grads(m),
                        [1 + len(list(model.parameters()))])
        elif v == "hooks":
            wrapped = HookedDDP(model)
            steps[v] = (wrapped, wrapped.wait, [len(list(model.parameters()))])
        elif v == "bucketed":
            wrapped = BucketedDDP(model, bucket_cap_mb=bucket_cap_mb)
            steps[v] = (wrapped, None, [len(wrapped.buckets)])
        else:
            wrapped = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
            calls = [0]

            def counting(state, bucket, calls=calls):
                calls[0] += 1
                return default_hooks.allreduce_hook(state, bucket)
            wrapped.register_comm_hook(None, counting)
            steps[v] = (wrapped, None, calls)
    times = {v: [] for v in versions}
    for i in range(repeats + 1):  # the first round warms up (and lets DDP rebuild buckets)
        progress(i, repeats, "repeats")  # rank 0 drives a panel's bar
        for v, (wrapped, finish, _) in steps.items():
            dist.barrier()
            t0 = time.perf_counter()
            wrapped.zero_grad(set_to_none=True)
            nn.functional.mse_loss(wrapped(X), y).backward()
            if finish is not None:
                finish()
            if i > 0:
                times[v].append(time.perf_counter() - t0)
        if i == 0 and "torch" in steps:
            steps["torch"][2][0] = 0  # count DDP's calls after its first step rebuilt buckets
    per_step = {v: steps[v][2][0] / repeats if v == "torch" else steps[v][2][0]
                for v in versions}
    return {v: (Stats.of(times[v]), per_step[v]) for v in versions}


# 04b's additions around PyTorch's DDP live in ddp_practice; re-exported so that
# ``lu.ddp.register_hook`` and ``labutils.run labutils.ddp:train_script`` keep working
from .launcher import progress
from .ddp_practice import (  # noqa: E402,F401
    HOOKS, AllReduceBytes, accumulate_with_no_sync, bf16_allreduce_hook,
    check_no_sync_accumulation, register_hook, train_script)
