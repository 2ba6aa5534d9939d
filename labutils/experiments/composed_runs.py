"""Running the composed data x tensor x pipeline (x context) step of 06e_composed_parallelism, observed from
outside: checked against one process, its communication counted per mesh dimension at the
dispatcher and set beside a formula, and a timeline of one step.

``run_composed`` launches ``parallel.composed.composed_worker`` with its step observed: the first
step runs under ``commcount.count_collectives`` (every call, by process group) and under
``timed_comm`` (a span per call, named by its mesh dimension), with the stage's forward and
backward spans from ``stage_observers.stage_spans``. ``formula_per_dim`` is what each dimension
should carry, from the layout and the model alone; ``planner_wire_bytes`` is the planner's
(``cost.step_time``) figure beside it. ``step_without_dp`` is a broken step the equality check
must catch (``max_relative_error``).
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from labutils.core.commcount import count_collectives
from labutils.core.i18n import N_
from labutils.core.launcher import launch
from labutils.core.timeline import Timeline
from labutils.experiments.composed_formula import (  # noqa: F401 (the lab reads them here)
    formula_per_dim,
    planner_wire_bytes,
    stage_param_numels,
)
from labutils.experiments.stage_observers import stage_spans
from labutils.parallel.composed import (
    RingAttend,
    composed_step,
    composed_worker,
    gpt_config,
    gpt_loss,
    reference_train,
    validate_composed,
)
from labutils.parallel.pipeline import run_schedule
from labutils.parallel.tensor_parallel import TPLayout, reference_shards
from labutils.parallel.torch_composed import torch_composed_worker

DIMS_SHOWN = ("pp", "dp", "tp")


def dims_shown(dims):
    """The rows of ``counts_table``: with cp > 1, the gradient all-reduce runs on the dp x cp
    group ("dp_cp") and the ring attention's messages on the cp group ("cp")."""
    return DIMS_SHOWN if dims.cp == 1 else ("pp", "dp_cp", "cp", "tp")
# float64 on both sides: the parallel sums run in another order, which costs ~1e-15 relative;
# a wrong split or a missing all-reduce changes a gradient by 1e-3 or more (the lab and
# tests/test_composed.py assert both ends with max_relative_error and step_without_dp).
RTOL, ATOL = 1e-9, 1e-12


def make_batch(batch=8, model_kwargs=None, seed=0):
    """Token ids ``x`` (B, T) and the next tokens ``y`` (B, T) of random sequences."""
    cfg = gpt_config(model_kwargs)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(cfg["vocab_size"], (batch, cfg["seq_len"] + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


# ---- observing one step ----------------------------------------------------------------------

# the span names "<dim> all-reduce", marked for lu.label (a timeline's legend shows them)
SPAN_NAMES = (N_("dp all-reduce"), N_("tp all-reduce"), N_("cp all-reduce"),
              N_("pp all-reduce"))


def _dim_of(op, group_name, names, cp_group=None):
    """The mesh dimension of a call: point-to-point calls are filed by their group, cp for the
    ring attention's (on the cp group), pp for the pipeline's (on the default group);
    collectives by their group; a collective on any other group is "other", which
    ``counts_table`` asserts never happens."""
    if op in ("send", "recv_", "recv_any_source_"):
        return "cp" if cp_group and group_name == cp_group else "pp"
    return names.get(group_name, "other")


class _TimedCollectives(TorchDispatchMode):
    """A span per collective, from its launch to its completion, named "<dim> all-reduce"."""

    def __init__(self, tl, names):
        super().__init__()
        self.tl, self.names = tl, names

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = str(func.overloadpacket).split(".")[-1]
        if func.namespace not in ("c10d", "_c10d_functional", "c10d_functional") or \
                op in ("send", "recv_", "recv_any_source_"):
            return func(*args, **(kwargs or {}))
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        # The caller (a blocking dist.all_reduce) waits for it at once anyway: wait here. Not
        # for gloo's send and recv: a second wait() on those waits for a second message.
        for w in (out if isinstance(out, (list, tuple)) else [out]):
            if isinstance(w, torch.ScriptObject):
                torch._C._distributed_c10d.Work.unbox(w).wait()
        group = next((torch._C._distributed_c10d.ProcessGroup.unbox(a).group_name
                      for a in args if _is_group(a)), "")
        self.tl.add(f"{_dim_of(op, group, self.names)} all-reduce", start,
                    time.perf_counter())
        return out


@contextlib.contextmanager
def timed_comm(tl, names):
    """Spans of this thread's communication inside the block: every collective (named by the
    mesh dimension of its group, ``names``: group name -> dimension) and every blocking
    ``dist.recv`` ("pp recv": the stage waiting for its neighbour), wrapped for the block only."""
    original = dist.recv

    def recv(tensor, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(tensor, *args, **kwargs)
        finally:
            tl.add("pp recv", start, time.perf_counter())
    dist.recv = recv
    try:
        with _TimedCollectives(tl, names):
            yield tl
    finally:
        dist.recv = original


def _is_group(a):
    if not isinstance(a, torch.ScriptObject):
        return False
    try:
        torch._C._distributed_c10d.ProcessGroup.unbox(a)
        return True
    except RuntimeError:
        return False


def _observed_worker(rank, world_size, dims, x, y, **kwargs):
    """``composed_worker``'s own loop; its first step counted and timed from outside."""
    first = {}

    def step_fn(stage, me, grad_group, ops, prev_ops, x_mbs, y_mbs, in_shape):
        if first:                                    # later steps run unobserved
            return composed_step(stage, me, grad_group, ops, prev_ops, x_mbs, y_mbs, in_shape)
        names = {grad_group.group_name: "dp" if me.dims.cp == 1 else "dp_cp"}
        if stage_tp_group(stage) is not None:
            names[stage_tp_group(stage).group_name] = "tp"
        cp_group = stage_cp_group(stage)
        cp_name = cp_group.group_name if cp_group is not None else None
        compute, comm = Timeline(rank), Timeline(rank)
        forwards = [i for op, i in ops if op == "F"]
        dist.barrier()                               # every rank starts the step together
        with count_collectives() as counted, timed_comm(comm, names), \
                stage_spans(stage, compute, forwards):
            loss = composed_step(stage, me, grad_group, ops, prev_ops, x_mbs, y_mbs, in_shape)
        per_dim = {d: {"calls": 0, "bytes": 0} for d in dims_shown(me.dims)}
        for c in counted.calls:
            d = per_dim.setdefault(_dim_of(c.op, c.group, names, cp_name),
                                   {"calls": 0, "bytes": 0})
            d["calls"] += 1
            d["bytes"] += c.nbytes
        first.update(counts=per_dim, spans=compute.spans + comm.spans)
        return loss

    result = composed_worker(rank, world_size, dims, x, y, step_fn=step_fn, **kwargs)
    return {**result, **first}


def stage_tp_group(stage):
    """The tensor-parallel group of a stage's Megatron layers (None: the stage has none)."""
    for module in stage.modules():
        layout = getattr(module, "layout", None)
        if isinstance(layout, TPLayout):
            return layout.group
    return None


def stage_cp_group(stage):
    """The context-parallel group of a stage's ring attention (None: the stage has none)."""
    for module in stage.modules():
        attend = getattr(module, "attend", None)
        if isinstance(attend, RingAttend):
            return attend.cp_group
    return None


def step_without_dp(stage, me, grad_group, ops, prev_ops, x_mbs, y_mbs, in_shape):
    """A broken ``composed_step``: the DP all-reduce forgotten, so each data slice keeps its own
    gradient. What the equality check must catch."""
    return run_schedule(ops, stage, me, x_mbs, y_mbs, in_shape, prev_ops, loss_fn=gpt_loss)


def run_composed(dims, batch=8, n_microbatches=2, steps=2, lr=0.1, model_kwargs=None, seed=0,
                 timeout=120.0, step_fn=None):
    """Validate (before any process starts), launch ``dims.world_size`` ranks, return
    per-rank results: ``coords``, ``losses``, ``grads``, ``params``, ``counts``, ``spans``.
    Oversubscribed (8 ranks on 2 cores) on purpose: nothing of it is timed against anything.
    ``step_fn`` (e.g. ``step_without_dp``): run it instead, unobserved (no counts, no spans)."""
    cfg = gpt_config(model_kwargs)
    validate_composed(dims, dims.world_size, batch, n_microbatches, cfg["hidden"],
                      cfg["num_heads"], cfg["n_layers"], cfg["seq_len"])
    x, y = make_batch(batch, model_kwargs, seed)
    worker, extra = ((_observed_worker, {}) if step_fn is None
                     else (composed_worker, {"step_fn": step_fn}))
    return launch(worker, dims, x, y, model_kwargs=model_kwargs,
                  n_microbatches=n_microbatches, steps=steps, lr=lr, **extra,
                  world_size=dims.world_size, timeout=timeout, warn_oversubscription=False)


def run_torch_composed(dims, batch=8, n_microbatches=2, steps=2, lr=0.1, model_kwargs=None,
                       seed=0, timeout=120.0):
    """The same training with PyTorch's pieces (``torch_composed``): per-rank results whose
    ``grads`` and ``params`` are whole tensors of the rank's stage."""
    cfg = gpt_config(model_kwargs)
    validate_composed(dims, dims.world_size, batch, n_microbatches, cfg["hidden"],
                      cfg["num_heads"], cfg["n_layers"], cfg["seq_len"])
    if dims.cp > 1:
        raise ValueError("the PyTorch composition here has no context parallelism; use cp=1")
    if dims.pp < 2:
        raise ValueError("PyTorch's pipelining schedules need pp >= 2 here; use pp=2")
    x, y = make_batch(batch, model_kwargs, seed)
    return launch(torch_composed_worker, dims, x, y, model_kwargs=model_kwargs,
                  n_microbatches=n_microbatches, steps=steps, lr=lr,
                  world_size=dims.world_size, timeout=timeout, warn_oversubscription=False)


# ---- the check against one process ----------------------------------------------------------

def expected_grad(name, grad, coords, dims, model_kwargs=None):
    """The slice of the single-process gradient ``name`` that a rank at ``coords`` holds."""
    layer = int(name.split(".")[0])
    if 1 <= layer <= gpt_config(model_kwargs)["n_layers"]:     # a Megatron layer: sharded
        return reference_shards(name, grad, TPLayout(coords["tp"], dims.tp))
    return grad                                          # embedding and head: replicated


def _pairs(results, dims, batch, steps, lr, model_kwargs, seed, sharded):
    """(label, got, want) for the losses and every rank's gradients (first step) and
    parameters (last step), beside one process on the whole batch."""
    x, y = make_batch(batch, model_kwargs, seed)
    ref = reference_train(x, y, model_kwargs, steps, lr)
    last = [r for r in results if r["coords"]["pp"] == dims.pp - 1]
    for r in last:                     # each dp slice's mean loss; the batch's is their mean
        assert len(r["losses"]) == steps
    losses = torch.tensor([[r["losses"][s] for s in range(steps)] for r in last],
                          dtype=torch.float64).mean(0)
    yield "losses", losses, torch.tensor(ref["losses"], dtype=losses.dtype)
    for r in results:
        for what in ("grads", "params"):
            for name, got in r[what].items():
                want = (expected_grad(name, ref[what][name], r["coords"], dims, model_kwargs)
                        if sharded else ref[what][name])
                yield f"rank at {r['coords']}, {what} {name}", got, want
    covered = {n for r in results for n in r["grads"]}
    assert covered == set(ref["grads"]), "some parameter is held by no rank"


def assert_equal_to_one_process(results, dims, batch=8, steps=2, lr=0.1, model_kwargs=None,
                                seed=0, sharded=True):
    """Assert losses, every parameter's gradient (first step) and parameters (last step) of
    every rank equal one process on the whole batch (RTOL, ATOL); return what was compared.
    ``sharded=False``: each rank returned whole tensors (``run_torch_composed``)."""
    n_grads, n_params = 0, set()
    for label, got, want in _pairs(results, dims, batch, steps, lr, model_kwargs, seed,
                                   sharded):
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL,
                                   msg=lambda m, lab=label: f"{lab}: {m}")
        if " grads " in label:
            n_grads += 1
            n_params.add(label.split()[-1])
    return {"losses": steps, "gradients": n_grads, "parameters": len(n_params)}


def max_relative_error(results, dims, batch=8, steps=2, lr=0.1, model_kwargs=None, seed=0,
                       sharded=True):
    """The largest normwise relative error over the losses and every rank's gradients and
    parameters: max |got - want| / max |want|, tensor by tensor."""
    return max(((got - want).abs().max() / want.abs().max()).item()
               for _, got, want in _pairs(results, dims, batch, steps, lr, model_kwargs, seed,
                                          sharded))


# ---- counted beside the formulas (composed_formula) -----------------------------------------

def counts_table(results, dims, batch=8, n_microbatches=2, model_kwargs=None):
    """Rows (stage, dim, counted calls, formula calls, counted bytes, formula bytes, planner's
    wire bytes), one per pipeline stage and dimension, after asserting every rank of a stage
    counted the same."""
    rows = []
    for s in range(dims.pp):
        counted = [r["counts"] for r in results if r["coords"]["pp"] == s]
        assert all(c == counted[0] for c in counted), f"ranks of stage {s} counted differently"
        assert set(counted[0]) == set(dims_shown(dims)), \
            f"stage {s} called a collective on a group of no mesh dimension: {counted[0]}"
        formula = formula_per_dim(dims, s, batch, n_microbatches, model_kwargs)
        planner = planner_wire_bytes(dims, s, batch, n_microbatches, model_kwargs)
        for d in dims_shown(dims):
            rows.append((s, d, counted[0][d]["calls"], formula[d]["calls"],
                         counted[0][d]["bytes"], formula[d]["bytes"], planner[d]))
    return rows
