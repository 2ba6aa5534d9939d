"""Collectives counted where they are issued, not computed from a formula.

Every c10d collective goes through PyTorch's dispatcher, where a ``TorchDispatchMode`` sees it
(as ``torch.distributed.tensor.debug.CommDebugMode`` does; that one also tracks modules, and its
tracker fails on a model whose forward skips a branch): ``dist.all_reduce`` (blocking or
``async_op=True``), and the bucket all-reduces of ``DistributedDataParallel``'s C++ reducer. So one definition holds for every DDP version a lab compares: the all-reduce calls this
rank issued, whatever their size. Counting adds Python work to every op: count in an untimed step.

    with count_collectives() as counted:
        model(x).sum().backward()
    counted.all_reduces
"""
from __future__ import annotations

import contextlib
from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode


class Counted:
    """Collectives issued in a ``count_collectives`` block, by c10d op name."""

    def __init__(self):
        self.by_op = Counter()

    @property
    def all_reduces(self):
        return sum(n for op, n in self.by_op.items() if "allreduce" in op)

    @property
    def total(self):
        return sum(self.by_op.values())

    def __repr__(self):
        return f"Counted({dict(self.by_op)})"


class _CountCollectives(TorchDispatchMode):
    def __init__(self, by_op):
        super().__init__()
        self.by_op = by_op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional", "c10d_functional"):
            self.by_op[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_collectives():
    """Count the collectives this process issues inside the block (on this thread)."""
    counted = Counted()
    with _CountCollectives(counted.by_op):
        yield counted
