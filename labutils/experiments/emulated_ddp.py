"""Data parallelism on emulated links (04c2 section 3, 07): speedup against link speed, and what
buckets, overlap and compression win back.

A 2-core laptop has no slow network, so its DDP runs look compute-bound. Here every gradient
bucket of ``lu.ddp.BucketedDDP`` goes through ``lu.emulation.emulated_allreduce_hook``: the real
all-reduce runs (results unchanged), then the hook waits out the time the alpha-beta model
gives for the link. Three ways of sending the same gradients are timed on each link, step by
step interleaved so that machine noise hits them alike:

* ``one bucket``: every gradient in one bucket, sent after backward has finished (no overlap);
* ``buckets``: small buckets, each sent as soon as its gradients are ready, during backward;
* ``buckets + bf16``: the same, the bucket cast to bfloat16 for the trip (half the bytes).

A fourth model runs under ``no_sync``-style local gradients (no communication at all): the
compute-only ceiling every speedup is measured against.
"""
from __future__ import annotations

import time
import uuid

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labutils.core.i18n import N_, label, tr
from labutils.core.launcher import launch
from labutils.core.rank import progress
from labutils.core.tables import text_table
from labutils.core.timing import Stats, slowest
from labutils.cost import costmodel as cm
from labutils.cost import step_time
from labutils.data import models
from labutils.parallel.ddp import BucketedDDP
from labutils.parallel.emulation import emulated_allreduce_hook

# variant -> (bucket_cap_mb, dtype on the wire); 1e6 MB puts every gradient in one bucket
VARIANTS = {
    N_("one bucket"): (1e6, None),
    N_("buckets"): (0.25, None),
    N_("buckets + bf16"): (0.25, torch.bfloat16),
}
NO_COMM = "no communication"
# a "link" that is no emulation: BucketedDDP's own gloo all-reduce, the real run the cost model
# (with this machine's fitted alpha and beta) is tested against; fp32 variants only
REAL = N_("real gloo")


def mlp(width=512, depth=4, classes=10, seed=0):
    """The model every variant trains: ``depth`` square layers, so gradients arrive layer by
    layer during backward (the last layer's first) and buckets have something to overlap."""
    return models.mlp((width,) * (depth + 1) + (classes,), seed=seed)


def make_variant(link, bucket_cap_mb, compress_dtype, width, depth):
    """One replica: BucketedDDP whose buckets travel over the emulated ``link``."""
    model = BucketedDDP(mlp(width, depth), bucket_cap_mb=bucket_cap_mb)
    model.register_comm_hook(None, emulated_allreduce_hook(link, compress_dtype=compress_dtype))
    return model


def link_name(link):
    return REAL if isinstance(link, str) and link == REAL else cm.get_link(link).name


def _variants_on(link, variants):
    """The variants ``link`` runs: on the real wire only those that send fp32."""
    if link_name(link) != REAL:
        return variants
    return {k: v for k, v in variants.items() if v[1] is None}


def step_times(rank, world_size, links, variants=None, steps=4, width=512, depth=4, batch=256):
    """Worker: seconds per training step (forward, backward, gradients averaged) of every
    (link, variant), interleaved step by step; plus the compute-only ceiling.

    Returns ``times`` {(link name, variant): [s, ...]}, ``grad_diff`` {(link, variant): max
    |grad - grad of BucketedDDP with its plain all-reduce, no emulation|} (0.0 where emulation
    and bucketing must change nothing), ``grad_bytes`` and ``num_buckets`` per variant.
    """
    variants = dict(VARIANTS if variants is None else variants)
    runs = {}
    for link in links:
        for name, (cap, dtype) in _variants_on(link, variants).items():
            runs[(link_name(link), name)] = (
                BucketedDDP(mlp(width, depth), bucket_cap_mb=cap) if link_name(link) == REAL
                else make_variant(link, cap, dtype, width, depth))
    runs[(None, NO_COMM)] = mlp(width, depth)   # gradients stay local: the ceiling
    torch.manual_seed(1000 + rank)              # each rank its own batch
    x, y = torch.randn(batch, width), torch.randint(10, (batch,))
    times = {key: [] for key in runs}
    for step in range(steps + 1):               # step 0 warms up
        progress(step, steps, "steps")  # rank 0 drives a panel's bar
        for key, model in runs.items():
            model.zero_grad(set_to_none=True)
            dist.barrier()                      # both ranks start each step together
            t0 = time.perf_counter()
            F.cross_entropy(model(x), y).backward()  # BucketedDDP: returns once averaged
            if step:
                times[key].append(time.perf_counter() - t0)
    def flat_grad(model):
        return torch.cat([p.grad.flatten() for p in model.parameters()])
    # the reference: BucketedDDP's own all-reduce average, no link emulated
    plain = BucketedDDP(mlp(width, depth))
    F.cross_entropy(plain(x), y).backward()
    reference = flat_grad(plain)
    grad_diff = {key: (flat_grad(model) - reference).abs().max().item()
                 for key, model in runs.items() if key[1] != NO_COMM}
    first = next(iter(runs.values()))
    num_buckets = {name: len(model.buckets) for (_, name), model in reversed(runs.items())
                   if name != NO_COMM}
    grad_bytes = sum(p.numel() * p.element_size() for p in first.parameters())
    return dict(times=times, grad_diff=grad_diff, grad_bytes=grad_bytes, num_buckets=num_buckets)


def run(links=("1GbE", "10GbE"), world_size=2, steps=4, width=512, depth=4, batch=256,
        variants=None, floor=None, timeout=300.0):
    """Launch ``step_times`` on real ranks; rows of measured and predicted speedup per
    (link, variant). Raises if any fp32 variant's gradients differ from plain BucketedDDP's, or
    bf16's by more than bf16 rounding: emulation changes time, never results.

    ``floor``: this machine's fitted ``(alpha, beta)`` (see ``predict``)."""
    variants = dict(VARIANTS if variants is None else variants)
    if floor is None and any(link_name(link) == REAL for link in links):   # before any rank
        raise ValueError(f"the {REAL!r} rows are predicted from this machine's fitted "
                         "floor=(alpha, beta); pass it")
    out = launch(step_times, list(links), variants, steps, width, depth, batch,
                    world_size=world_size, timeout=timeout)
    assert_same_gradients(out, variants)
    # a step of the job ends when its slowest rank does: per step, the max over ranks
    rounds = uuid.uuid4().hex   # every variant ran in each step: lu.timing.compare pairs them
    stats = {key: Stats.of(slowest([res["times"][key] for res in out]), rounds)
             for key in out[0]["times"]}
    compute = stats[(None, NO_COMM)]
    res0 = out[0]
    rows = []
    for link in links:
        real = link_name(link) == REAL
        wire = tuple(floor) if real else link   # the real rows: the model on the fitted floor
        for name, (cap, dtype) in _variants_on(link, variants).items():
            step = stats[(link_name(link), name)]
            rows.append(dict(
                link=link_name(link), gbps=cm.get_link(wire).bandwidth * 8e-9,
                variant=name, step=step, compute=compute,
                measured=world_size * compute.median / step.median,
                predicted=predict(compute.median, res0["grad_bytes"], wire, world_size,
                                  res0["num_buckets"][name], overlap=name != "one bucket",
                                  compressed=dtype is not None, floor=None if real else floor),
                binds=N_("local") if real else binding_floor(
                    res0["grad_bytes"], link, world_size, res0["num_buckets"][name],
                    dtype is not None, floor)))
    return rows


def binding_floor(grad_bytes, link, world_size, num_buckets, compressed, floor):
    """Which floor sets a step's all-reduce time: ``"link"`` when the emulated link's modelled
    all-reduce of the gradients takes longer than this machine's own (fitted ``floor``,
    ``(alpha, beta)``), ``"local"`` when the real all-reduce under the emulation takes longer:
    then the hook's wait is already over when gloo finishes, and the row shows this machine,
    not the link. ``None`` without a floor."""
    if floor is None:
        return None
    nbytes = grad_bytes / 2 if compressed else grad_bytes
    on_link = step_time.data_parallel_step(0.0, nbytes, world_size, link,
                                           num_buckets=num_buckets).comm
    here = step_time.data_parallel_step(0.0, nbytes, world_size, tuple(floor),
                                        num_buckets=num_buckets).comm
    return N_("link") if on_link > here else N_("local")


def assert_same_gradients(per_rank, variants):
    """Raise unless every fp32 variant's gradients equal plain BucketedDDP's exactly and every
    compressed variant's are within bf16 rounding (1e-2): only time may change."""
    for r, res in enumerate(per_rank):
        for (link, name), diff in res["grad_diff"].items():
            limit = 0.0 if variants[name][1] is None else 1e-2
            if diff > limit:
                raise AssertionError(f"rank {r}: {name} on {link} changed the gradients by "
                                     f"{diff:.3g} (allowed {limit:g})")


def predict(compute_s, grad_bytes, link, world_size, num_buckets, overlap, compressed,
            floor=None):
    """The cost model's speedup: compute plus the all-reduce time that backward cannot hide
    (``step_time.data_parallel_step`` on ``link``).

    ``floor``: this machine's fitted ``(alpha, beta)``. The emulated link only adds waiting to
    the real all-reduce, and the real one is CPU work on the very cores that run backward, so
    overlap cannot hide it: the exposed time is at least the machine's own all-reduce.
    """
    nbytes = grad_bytes / 2 if compressed else grad_bytes
    step = step_time.data_parallel_step(compute_s, nbytes, world_size, link,
                                        overlap=1.0 if overlap else 0.0, num_buckets=num_buckets)
    exposed = step.exposed_comm
    if floor is not None:
        here = step_time.data_parallel_step(compute_s, nbytes, world_size, tuple(floor),
                                            num_buckets=num_buckets)
        exposed = max(exposed, here.comm)
    return world_size * compute_s / (compute_s + exposed)


def table(rows, binds=False):
    """The rows as text: one line per (link, variant); ``binds=True`` adds which floor binds
    (``binding_floor``) and leaves out the model column (a check of the bookkeeping only)."""
    compute = tr("compute only: {ms} ms per step", ms=f"{rows[0]['compute'].median * 1e3:.1f}")
    if binds:
        body = text_table([(label(r["link"]), label(r["variant"]),
                            f"{r['step'].median * 1e3:.1f}", f"{r['measured']:.2f}",
                            label(r["binds"])) for r in rows],
                          [tr("link"), tr("variant"), tr("step ms"), tr("speedup (of medians)"),
                           tr("floor that binds")])
        return body + "\n" + compute
    body = text_table([(label(r["link"]), label(r["variant"]),
                        f"{r['step'].median * 1e3:.1f}", f"{r['measured']:.2f}",
                        f"{r['predicted']:.2f}") for r in rows],
                      [tr("link"), tr("variant"), tr("step ms"), tr("speedup"), tr("model")])
    return body + "\n" + compute
