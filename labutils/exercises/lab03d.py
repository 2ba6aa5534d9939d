"""Exercise checkers of lab 03d: the mean gradient in one fp16 all-reduce, without overflow.
Registered in ``labutils.course``; notebooks call them as ``lu.check_<name>``."""
import torch
import torch.distributed as dist

from labutils.core.commcount import count_collectives
from labutils.core.i18n import tr
from labutils.exercises.base import make_cases, run_check

BIG = 40000.0   # fp16 holds it (max 65504); the sum of two ranks' does not


def fp16_mean(tensors, world_size):
    """Reference: replace every tensor, in place, by its mean over the ranks, sent as ONE fp16
    all-reduce. Each rank divides by ``world_size`` before the cast, so the sum of the ranks'
    shares stays within fp16's range (PyTorch's ``fp16_compress_hook`` also divides before the
    all-reduce, but after the cast, so a value above 65504 already overflows in its cast)."""
    flat = (torch.cat([t.reshape(-1) for t in tensors]) / world_size).to(torch.float16)
    dist.all_reduce(flat)
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t))


def _rank_tensors(seed, rank, shapes):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    tensors = [torch.randn(s, generator=g) for s in shapes]
    tensors[0].view(-1)[0] = BIG            # a large gradient, the same on every rank
    return tensors


def _fp16_mean_harness(rank, world_size, learner_fn, seed, shapes):
    every = [_rank_tensors(seed, r, shapes) for r in range(world_size)]
    mean = [sum(ts[i] for ts in every) / world_size for i in range(len(shapes))]
    mine = _rank_tensors(seed, rank, shapes)
    before = [t.clone() for t in mine]
    sent, real = [], dist.all_reduce

    def spy(tensor, *args, **kwargs):       # which dtype went over the wire
        sent.append(str(tensor.dtype).replace("torch.", ""))
        return real(tensor, *args, **kwargs)

    dist.all_reduce = spy
    try:
        with count_collectives() as counted:
            learner_fn(mine, world_size)
    finally:
        dist.all_reduce = real
    calls = counted.all_reduces
    dtypes = sorted(set(sent))
    finite = all(bool(torch.isfinite(t).all()) for t in mine)
    unchanged = all(torch.equal(t, b) for t, b in zip(mine, before))
    calls_key, dtype_key, in_place, overflow = (tr("all-reduce calls"), tr("dtype sent"),
                                                tr("in place"), tr("overflow"))
    hold, none = tr("the tensors hold the result"), tr("none")
    expected = {calls_key: 1, dtype_key: "float16",   # checked in this order
                in_place: hold, overflow: none, tr("mean"): mean}
    got = {calls_key: calls,
           dtype_key: dtypes[0] if len(dtypes) == 1 else
           (tr("nothing sent") if not dtypes else tr("several: {dtypes}",
                                                      dtypes=", ".join(dtypes))),
           # messages are cut at 60 characters: each says what is wrong in fewer
           in_place: (hold if not unchanged else tr("unchanged: copy_ the mean into them")),
           overflow: (none if finite else
                      tr("inf: fp16 sum overflowed, divide by world_size before")),
           tr("mean"): mine}
    return expected, got


def check_fp16_mean(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(tensors, world_size)``: every tensor becomes (in place) its mean over
    the ranks, sent as exactly one all-reduce of float16, with no overflow although one element
    is 40000 on every rank."""
    cases = make_cases(world_sizes=(2, 3, 4), per_world_size=1, seed=3,
                       shapes=[[(3, 4), (5,)], [(6,), (2, 2), (1,)], [(4, 4)]])
    return run_check("fp16_mean", learner_fn, _fp16_mean_harness, cases, timeout=timeout,
                     atol=1e-2, rtol=2e-3)
