"""Collectives counted where they are issued, not computed from a formula.

Every c10d collective goes through PyTorch's dispatcher, where a ``TorchDispatchMode`` sees it
(as ``torch.distributed.tensor.debug.CommDebugMode`` does; that one also tracks modules, and its
tracker fails on a model whose forward skips a branch): ``dist.all_reduce`` (blocking or
``async_op=True``), point-to-point ``send``/``recv``, and the bucket all-reduces of
``DistributedDataParallel``'s C++ reducer. So one definition holds for every version a lab
compares, PyTorch's included, and the lesson code carries no counter of its own.

Each call is recorded as a ``Call``: its op, the payload bytes it was handed, the group's size,
the peer of a point-to-point message, for an all-to-all the bytes per peer from its split sizes
(``off_rank_bytes``: those for other ranks), and two clocks: ``launched`` (when this thread
issued it) and ``completed`` (when its ``Work`` finished, read on the communication thread by a
callback on the work's future). ``completed - launched`` therefore includes any queueing behind
earlier calls and the wait for the peer; ``experiments/`` splits those apart where a lab needs it.
Counting adds Python work to every op: count in an untimed step unless the clocks are the point.

    with count_collectives() as counted:
        model(x).sum().backward()
    counted.all_reduces, counted.bytes_by_op["allreduce_"], counted.calls[0].nbytes
"""
from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
# Which argument holds the payload (the tensors the call was handed to send or reduce), by op.
# Ops not listed: every tensor in the first argument.
_PAYLOAD_ARG = {"_allgather_base_": 1, "allgather_": 1, "allgather_into_tensor_coalesced_": 1,
                "_reduce_scatter_base_": 1, "reduce_scatter_": 1,
                "reduce_scatter_tensor_coalesced_": 1, "alltoall_base_": 1, "alltoall_": 1,
                "barrier": None}
_PEER_ARG = {"send": 2, "recv_": 2, "recv_any_source_": None}


@dataclass
class Call:
    """One collective or point-to-point call this rank issued."""
    op: str                # c10d op name: "allreduce_", "send", "recv_", "alltoall_base_", ...
    nbytes: int            # payload bytes handed to the call (see _PAYLOAD_ARG)
    group_size: int        # ranks in the call's process group (0 when unknown)
    peer: int | None       # destination of a send, source of a recv (group rank); else None
    launched: float        # perf_counter on the issuing thread, before the call
    completed: float | None = None   # perf_counter when its Work finished; None when not
    # seen: the block ended first, or the Work has no future (gloo's send and recv)
    group: str = ""        # the process group's name, to tell calls on different groups apart
    # all-to-all only (else None): this rank's place in the group, and the bytes it hands for
    # each destination / receives from each source, from the call's split sizes
    group_rank: int | None = None
    send_split_bytes: list | None = None
    recv_split_bytes: list | None = None

    @property
    def is_p2p(self):
        return self.op in ("send", "recv_", "recv_any_source_")

    @property
    def off_rank_bytes(self):
        """Bytes an all-to-all hands for OTHER ranks (its own block stays in memory)."""
        return sum(b for r, b in enumerate(self.send_split_bytes) if r != self.group_rank)


class Counted:
    """Collectives issued in a ``count_collectives`` block: every ``Call``, and sums by op."""

    def __init__(self):
        self.calls = []

    @property
    def by_op(self):
        return Counter(c.op for c in self.calls)

    @property
    def bytes_by_op(self):
        out = Counter()
        for c in self.calls:
            out[c.op] += c.nbytes
        return out

    @property
    def all_reduces(self):
        return sum(1 for c in self.calls if "allreduce" in c.op)

    @property
    def sends(self):
        return [c for c in self.calls if c.op == "send"]

    @property
    def sent_bytes(self):
        return sum(c.nbytes for c in self.sends)

    @property
    def total(self):
        return len(self.calls)

    def of(self, *ops):
        """The calls whose op is one of ``ops`` (substrings: ``of("allreduce")``)."""
        return [c for c in self.calls if any(o in c.op for o in ops)]

    def __repr__(self):
        return f"Counted({dict(self.by_op)})"


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for item in x:
            yield from _tensors(item)


def _group(args):
    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                pg = torch._C._distributed_c10d.ProcessGroup.unbox(a)
            except RuntimeError:        # another ScriptObject (a ReduceOp, a Work)
                continue
            return pg.size(), pg.group_name, pg.rank()
    return 0, "", None


def _split_bytes(tensor, splits, group_size):
    """Bytes per peer of one side of ``alltoall_base_``: rows by ``splits`` (equal when empty)."""
    rows = tensor.shape[0] if tensor.dim() else tensor.numel()
    row_bytes = tensor.numel() * tensor.element_size() // rows if rows else 0
    if not splits:
        splits = [rows // group_size] * group_size if group_size else []
    return [int(n) * row_bytes for n in splits]


def _works(out):
    if isinstance(out, torch.ScriptObject):
        yield out
    elif isinstance(out, (list, tuple)):
        for item in out:
            yield from _works(item)


class _CountCollectives(TorchDispatchMode):
    def __init__(self, calls):
        super().__init__()
        self.calls = calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace not in _NAMESPACES:
            return func(*args, **(kwargs or {}))
        op = str(func.overloadpacket).split(".")[-1]
        where = _PAYLOAD_ARG.get(op, 0)
        nbytes = 0 if where is None else sum(
            t.numel() * t.element_size() for t in _tensors(args[where]))
        peer_at = _PEER_ARG.get(op)
        size, name, group_rank = _group(args)
        call = Call(op, nbytes, size, args[peer_at] if peer_at is not None else None,
                    time.perf_counter(), group=name)
        if op == "alltoall_base_":      # (output, input, group, output splits, input splits)
            call.group_rank = group_rank
            call.send_split_bytes = _split_bytes(args[1], args[4], size)
            call.recv_split_bytes = _split_bytes(args[0], args[3], size)
        elif op == "alltoall_":         # (outputs, inputs, group): one tensor per peer
            call.group_rank = group_rank
            call.send_split_bytes = [t.numel() * t.element_size() for t in args[1]]
            call.recv_split_bytes = [t.numel() * t.element_size() for t in args[0]]
        self.calls.append(call)
        out = func(*args, **(kwargs or {}))
        for w in _works(out):
            try:
                fut = torch._C._distributed_c10d.Work.unbox(w).get_future()
            except RuntimeError:
                continue
            # runs on the thread that completes the work (gloo's), when it completes
            fut.add_done_callback(lambda _f, c=call: setattr(c, "completed", time.perf_counter()))
        return out


@contextlib.contextmanager
def count_collectives():
    """Record the collectives this process issues inside the block (on this thread)."""
    counted = Counted()
    with _CountCollectives(counted.calls):
        yield counted


class AllReduceBytes:
    """``with counter:`` counts the calls and bytes this rank hands to ``dist.all_reduce``
    inside it, on every thread.

    Why not ``count_collectives``: a dispatch mode is thread-local, and a DDP comm hook such as
    PowerSGD issues two of its three all-reduces from futures' callbacks, which usually run on
    gloo's thread. Wrapping ``dist.all_reduce`` itself, for the ``with`` block only, sees every
    thread's calls; PyTorch's hooks call it by that name."""

    def __init__(self):
        self.nbytes, self.calls = 0, 0

    def __enter__(self):
        self.original = torch.distributed.all_reduce

        def counting(tensor, *args, **kwargs):
            self.nbytes += tensor.numel() * tensor.element_size()
            self.calls += 1
            return self.original(tensor, *args, **kwargs)
        torch.distributed.all_reduce = counting
        return self

    def __exit__(self, *exc):
        torch.distributed.all_reduce = self.original
