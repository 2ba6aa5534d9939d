"""Memory of a training step: the formula, and a measured peak to check it against (on CPU).

Used by ``03e2_hardware_constraints`` (hardware constraints), ``05_model_parallel_principles`` (the memory
wall) and ``06c1_zero_stages``, ``06c2_fsdp_and_memory`` (ZeRO/FSDP per-rank memory).

The formula (Rajbhandari et al., "ZeRO", SC 2020, section 3): a step with ``P`` parameters keeps

* weights      ``P * dtype_bytes``
* gradients    ``P * dtype_bytes``
* optimizer    ``P * 4 * k`` (fp32 state: ``k`` = 0 for SGD, 1 for SGD with momentum, 2 for Adam),
  plus ``P * 4`` for an fp32 master copy when the weights are in lower precision
* activations  what autograd saves for backward in one forward pass: counted here with
  ``torch.autograd.graph.saved_tensors_hooks`` (every tensor packed for backward, each storage
  once, parameters excluded because they are already counted), so no per-layer table can drift.
* temporary    scratch of the op running at the peak: twice the largest weight (Adam's
  temporaries, a fresh gradient), or, walking backward, two activation gradients on top of
  the saved activations not yet freed, whichever is larger.

That sum assumes every gradient stays allocated through the step (``zero_grad(set_to_none=
False)``, what ``train_steps`` does by default). With ``gradients="fresh"`` (gradients set to
None before each step, PyTorch's default) gradients and activations never all coexist: backward
makes the gradients of a layer as it frees the activations that layer saved. The formula then
walks the leaf modules backward (``backward_walk``) and reports each term as it stands at the
peak of forward + backward: weights, optimizer state, the gradients made so far, the activations not
yet freed, and the op's two activation gradients (the one it receives, the one it makes).
``step_memory`` adds the optimiser step (every gradient, no activation left) and reports the
larger phase: the formula for a whole step under either ``zero_grad`` (03e2).

``live_peak(fn)`` (``LiveBytes``) measures the real thing by watching every op: each storage an
op makes is remembered (weakly, so remembering it keeps nothing alive), and after every op the
bytes of those still alive are added up; the peak is the largest sum. It counts what tensors
hold, not an op's internal scratch, so the figure is the same on every CPU and thread count,
and a storage counts until it dies, on whichever thread drops it last (gloo's, for a
collective's buffers): nothing is missed. 06c1 and 06c2 measure ZeRO and FSDP2 with it.

``measure_peak(fn)`` (03e2, 05, 06a2) measures it from the allocator: CPU tensors have no
``torch.cuda.max_memory_allocated``, but the CPU allocator reports every allocation and free to
the profiler when ``profile_memory=True``. Replaying those events in order gives live tensor
bytes over time, and their maximum is the peak. It counts every tensor byte (including an op's
scratch buffers) and nothing else (no Python objects, no allocator slack), and an op allocates
the same sizes for the same shapes, so for one model, input and thread count the figure repeats
run to run. It is not the same on every machine: some kernels' scratch buffers depend on the CPU
and the thread count (06c1 shows one), so compare it with the formula within a margin.

API (bytes everywhere)::

    est = lu.memory.model_memory(model, optimizer="adam", example_input=x)
    # {'parameters': P, 'weights': ..., 'gradients': ..., 'optimizer': ..., 'activations': ...,
    #  'temporary': ..., 'total': ...}
    _, peak = lu.memory.measure_peak(lu.memory.train_steps, make_model, x, y, "adam")
    _, peak = lu.memory.live_peak(lu.memory.train_steps, make_model, x, y, "adam")
    est = lu.memory.step_memory(model, "adam", example_input=x)   # PyTorch's default zero_grad
"""
from __future__ import annotations

import itertools
import os
import weakref

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type
from torch.utils._pytree import tree_leaves

from labutils.core.i18n import N_

# fp32 state tensors per parameter that each optimiser keeps (ZeRO paper's K / 4).
OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
TERMS = (N_("weights"), N_("gradients"), N_("optimizer"), N_("activations"), N_("temporary"))


def count_parameters(model):
    """Number of trainable parameters (each shared tensor once)."""
    seen = {id(p): p for p in model.parameters() if p.requires_grad}
    return sum(p.numel() for p in seen.values())


def activation_bytes(model, example_input):
    """Bytes autograd saves for backward in one forward pass of ``model(example_input)``.

    Every tensor packed for backward is counted once per storage; parameters are left out
    (they are the weights term). The input batch is included when a layer saves it.
    """
    return sum(saved_storages(model, example_input).values())


def saved_storages(model, example_input):
    """{storage address: bytes} of the tensors autograd saves for backward (parameters out)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params and st.device.type != "meta":
            saved[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(example_input)
    del out
    return saved


def model_memory(model, optimizer="adam", dtype_bytes=4, batch=None, example_input=None,
                 master_weights=None, gradients="kept"):
    """The memory formula for one training step of ``model``; a dict of bytes.

    ``optimizer``: one of ``OPTIMIZER_STATES`` ("sgd", "momentum", "adam", "adamw").
    ``dtype_bytes``: bytes per weight and gradient (4 fp32, 2 fp16/bf16).
    ``example_input``: a batch to count activations on (``activation_bytes``); without it the
    activations term is 0. ``batch``: scale the activations to this batch size (they grow
    linearly with it; the batch size of ``example_input`` is its first dimension).
    ``master_weights``: keep an fp32 copy of the weights (default: when ``dtype_bytes < 4``).
    ``gradients``: "kept" (allocated through the step: the sum of every term) or "fresh" (set to
    None before the step: the terms at the peak of forward + backward, ``backward_walk``).
    """
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"unknown optimizer {optimizer!r}; use one of "
                         f"{', '.join(OPTIMIZER_STATES)}")
    if dtype_bytes not in (1, 2, 4, 8):
        raise ValueError(f"dtype_bytes must be 1, 2, 4 or 8 (bytes per value); got {dtype_bytes!r}")
    if batch is not None and example_input is None:
        raise ValueError("batch= needs example_input= (a batch to count activations on)")
    if gradients not in ("kept", "fresh"):
        raise ValueError(f"gradients must be 'kept' or 'fresh'; got {gradients!r}")
    n = count_parameters(model)
    if master_weights is None:
        master_weights = dtype_bytes < 4
    if gradients == "fresh":
        if example_input is None or batch is not None or dtype_bytes != 4:
            raise ValueError("gradients='fresh' walks a real fp32 backward: give example_input= "
                             "(no batch=, dtype_bytes=4)")
        out = {"parameters": n, "weights": n * dtype_bytes,
               "optimizer": n * 4 * (OPTIMIZER_STATES[optimizer] + int(master_weights)),
               **backward_walk(model, example_input)}
        out["total"] = sum(out[t] for t in TERMS)
        return out
    acts = backward_extra = 0
    if example_input is not None:
        saved = list(saved_storages(model, example_input).values())  # in forward order
        scale = 1.0 if batch is None else batch / example_input.shape[0]
        saved = [int(b * scale) for b in saved]
        acts = sum(saved)
        # Backward frees saved tensors as it walks back; at the layer that saved tensor k, the
        # tensors saved before k are still live, plus two gradients about tensor k's size.
        prefix = 0
        for size in saved:
            prefix += size
            backward_extra = max(backward_extra, prefix + 2 * size - acts)
    largest_param = max((p.numel() for p in model.parameters() if p.requires_grad), default=0)
    out = {"parameters": n,
           "weights": n * dtype_bytes,
           "gradients": n * dtype_bytes,
           "optimizer": n * 4 * (OPTIMIZER_STATES[optimizer] + int(master_weights)),
           "activations": acts,
           # Scratch of one op at a time, never kept: two tensors the size of the largest
           # weight (Adam's sqrt and divide; a fresh gradient before it is added to .grad), or
           # in backward two activation gradients beside the activations not yet freed.
           "temporary": max(2 * largest_param * dtype_bytes, backward_extra)}
    out["total"] = sum(out[t] for t in TERMS)
    return out


def backward_walk(model, example_input):
    """Gradients, activations and temporary bytes at the peak of forward + backward, gradients
    fresh; {"gradients", "activations", "temporary"}.

    Each leaf module, in forward order, gets the storages first saved for backward while it runs
    (parameters out), the gradients of its parameters, and the sizes of its output and input.
    Backward visits the modules in reverse; at module j these are live: the gradients of modules
    j and after, the activations saved by modules j and before, and two activation gradients
    (d output of j, received; d input of j, made, when the input needs a gradient). The model's
    output counts as live throughout too: the caller holds it until backward returns.
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen, rows = set(), []

    def pre(module, args):
        inp = args[0] if args and torch.is_tensor(args[0]) else None
        grad_in = inp.nbytes if inp is not None and inp.requires_grad else 0
        rows.append({"saved": 0, "keys": set(), "grads": sum(p.numel() * p.element_size()
                                               for p in module.parameters(recurse=False)
                                               if p.requires_grad),
                     "grad_in": grad_in, "grad_out": 0})

    def post(module, args, output):
        rows[-1]["grad_out"] = output.nbytes if torch.is_tensor(output) else 0

    def pack(t):
        st = t.untyped_storage()
        key = st.data_ptr()
        if rows and key not in params and key not in seen and st.device.type != "meta":
            seen.add(key)
            rows[-1]["saved"] += st.nbytes()
            rows[-1]["keys"].add(key)
        return t

    leaves = [m for m in model.modules() if not list(m.children())]
    hooks = [h for m in leaves for h in (m.register_forward_pre_hook(pre),
                                         m.register_forward_hook(post))]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            output = model(example_input)
    finally:
        for h in hooks:
            h.remove()
    out_key = output.untyped_storage().data_ptr()
    best = {"gradients": 0, "activations": 0, "temporary": 0}
    for j in range(len(rows)):
        held = any(out_key in r["keys"] for r in rows[:j + 1])   # saved: counted already
        now = {"gradients": sum(r["grads"] for r in rows[j:]),
               "activations": sum(r["saved"] for r in rows[:j + 1]) + (0 if held else output.nbytes),
               "temporary": rows[j]["grad_out"] + rows[j]["grad_in"]}
        if sum(now.values()) > sum(best.values()):
            best = now
    return best


def measure_peak(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)``; return ``(result, peak_bytes)``.

    ``peak_bytes`` is the largest amount of CPU tensor memory live at any moment of the call,
    above what was live when it began (tensors created before the call and freed inside it
    count negative). Read from the allocator's own reports to the profiler, so it is exact for
    this call (scratch buffers can differ between CPUs and thread counts: see the module notes).
    The profiler slows the call down (fine for small models).
    """
    os.environ.setdefault("KINETO_LOG_LEVEL", "99")  # keep kineto's start/stop lines quiet
    # torch.autograd.profiler directly: torch.profiler.profile would import torch._inductor
    # first (seconds), which this does not need.
    with torch.autograd.profiler.profile(use_cpu=True, profile_memory=True) as prof:
        result = fn(*args, **kwargs)
    events = [e for e in prof.kineto_results.events()
              if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]
    events.sort(key=lambda e: e.start_ns())
    live = itertools.accumulate(e.nbytes() for e in events)
    return result, max(0, max(live, default=0))


class LiveBytes(TorchDispatchMode):
    """Inside the block: ``now``, the bytes of tensor storage made in the block and still alive;
    ``peak``, the largest ``now`` after any op. Storages made before the block are not counted."""

    def __init__(self):
        super().__init__()
        self.peak = 0
        self._made = weakref.WeakValueDictionary()  # id -> storage, dropped when it dies

    @property
    def now(self):
        # current sizes, not the sizes at birth: FSDP2 frees and refills a gathered weight's
        # storage with storage.resize_, which is no op a dispatch mode sees
        return sum(st.nbytes() for st in list(self._made.values()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            return NotImplemented  # a DTensor: see the ops on its local tensors instead
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        made = [st for st in (t.untyped_storage() for t in tree_leaves(out)
                              if isinstance(t, torch.Tensor) and t.device.type != "meta")
                if id(st) not in inputs]  # a view or an in-place result is no new storage
        if made:  # memory only grows where an op makes a storage: look there
            self._made.update((id(st), st) for st in made)
            self.peak = max(self.peak, self.now)
        return out


def live_peak(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` under ``LiveBytes``; return ``(result, peak_bytes)``: the most
    bytes of storage made inside the call alive at once, after any op (see the module notes)."""
    with LiveBytes() as live:
        result = fn(*args, **kwargs)
    return result, live.peak


def train_steps(make_model, x, y, optimizer="adam", steps=2, lr=1e-3, set_to_none=False):
    """Build a model with ``make_model()`` and train it ``steps`` steps on ``(x, y)``.

    A whole training step from nothing, so ``measure_peak`` sees every byte: weights, the
    optimiser state (created at the first step), gradients and activations. Returns the losses.
    ``set_to_none``: passed to ``zero_grad``; False (the default here) keeps the gradients
    allocated between steps, as the formula's sum counts them; True is PyTorch's default.
    """
    model = make_model()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = {"sgd": lambda: torch.optim.SGD(params, lr=lr),
           "momentum": lambda: torch.optim.SGD(params, lr=lr, momentum=0.9),
           "adam": lambda: torch.optim.Adam(params, lr=lr, foreach=False),
           "adamw": lambda: torch.optim.AdamW(params, lr=lr, foreach=False)}[optimizer]()
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def step_memory(model, optimizer="adam", example_input=None, set_to_none=True):
    """The formula for one whole step (forward, backward, optimizer step) under ``zero_grad(
    set_to_none=...)``; ``model_memory``'s dict plus ``"phase"``, where the peak falls.

    ``set_to_none=False``: every gradient stays allocated, so at the peak all terms coexist:
    ``model_memory``'s sum (phase "backward"). ``set_to_none=True`` (PyTorch's default): no
    moment holds every gradient *and* every activation. The peak is the larger of two phases:
    "backward" (``backward_walk``: the gradients made so far beside the activations not yet
    freed) and "optimizer step" (every gradient, no activation: backward freed them, plus the
    step's scratch, two tensors the size of the largest weight).
    """
    if not set_to_none:
        return {**model_memory(model, optimizer=optimizer, example_input=example_input),
                "phase": "backward"}
    walk = model_memory(model, optimizer=optimizer, example_input=example_input,
                        gradients="fresh")
    largest = max((p.numel() * p.element_size() for p in model.parameters()
                   if p.requires_grad), default=0)
    step = {**walk, "gradients": walk["weights"], "activations": 0, "temporary": 2 * largest}
    step["total"] = sum(step[t] for t in TERMS)
    best = max((walk, "backward"), (step, "optimizer step"), key=lambda e: e[0]["total"])
    return {**best[0], "phase": best[1]}


def formula_vs_peak(make_model, x, y, optimizer="adam", steps=2, set_to_none=False):
    """Formula vs measured peak of ``train_steps``: ``(estimate dict, peak_bytes)``. The
    estimate is ``step_memory``'s: ``model_memory``'s sum for kept gradients (the default
    here), the larger phase for PyTorch's default (``set_to_none=True``), named in "phase"."""
    torch.manual_seed(0)
    estimate = step_memory(make_model(), optimizer=optimizer, example_input=x,
                           set_to_none=set_to_none)
    _, peak = measure_peak(train_steps, make_model, x, y, optimizer, steps, set_to_none=set_to_none)
    return estimate, peak
