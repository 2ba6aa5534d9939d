"""The alpha-beta cost model of collectives, its fit to measurements, and emulated links.

Used by 03a (fit alpha and beta to measured all-reduce times), 04c (emulated links as a DDP
comm hook; predicted vs measured speedup) and 07 (the model calibrated here predicts scale).

Units, everywhere in this module: ``nbytes`` in bytes, times in seconds, ``alpha`` (latency per
message step) in seconds, ``beta`` (inverse bandwidth) in seconds per byte, so a link of
bandwidth B bytes/s has ``beta = 1 / B``.

``nbytes`` is always the size of the *whole* buffer one rank holds: the tensor handed to
all-reduce or broadcast, the full (concatenated) output of all-gather, the full input of
reduce-scatter, the message of send/recv. The formulas are those of Thakur, Rabenseifner and
Gropp (2005) and Patarasuk and Yuan (2009), without the reduction's compute term:

=============  ==========================================  ====================================
collective     ring                                        tree / recursive variants
=============  ==========================================  ====================================
all-reduce     2(p-1) a + 2(p-1)/p n b                      tree: 2 L (a + n b) (reduce+bcast)
                                                            recursive_doubling: L (a + n b)
                                                            halving_doubling: 2 L a + 2(p-1)/p n b
reduce-scatter (p-1) a + (p-1)/p n b                        recursive halving: L a + (p-1)/p n b
all-gather     (p-1) a + (p-1)/p n b                        recursive doubling: L a + (p-1)/p n b
broadcast      (L + p-1) a + 2(p-1)/p n b (scatter+ring)    tree / recursive: L (a + n b)
send/recv      a + n b                                      (same)
=============  ==========================================  ====================================

with p = world_size, L = ceil(log2 p). Every collective costs 0 when p = 1.
"""
from __future__ import annotations

import math

import numpy as np

ALGORITHMS = ("ring", "tree", "recursive_doubling", "halving_doubling")


# ---- the closed forms: each returns (number of alpha terms, bytes multiplier of beta) ----

def _check(nbytes, world_size, algorithm):
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    p = np.asarray(world_size)
    if np.any(p < 1) or np.any(p != np.floor(p)):
        raise ValueError(f"world_size must be an integer >= 1; got {world_size!r}")
    if np.any(np.asarray(nbytes) < 0):
        raise ValueError(f"nbytes must be >= 0 (a size in bytes); got {nbytes!r}")
    return p.astype(float)


def _log2(p):
    return np.ceil(np.log2(p))


def _terms(op, world_size, algorithm, nbytes=0):
    """(alpha count, beta multiplier on nbytes) of ``op``; linear in alpha and beta."""
    p = _check(nbytes, world_size, algorithm)
    L, share = _log2(p), (p - 1) / p
    if op == "allreduce":
        table = {"ring": (2 * (p - 1), 2 * share), "tree": (2 * L, 2 * L),
                 "recursive_doubling": (L, L), "halving_doubling": (2 * L, 2 * share)}
    elif op in ("reduce_scatter", "all_gather"):
        # tree: reduce (gather) to a root along a binomial tree, then scatter (broadcast)
        table = {"ring": (p - 1, share), "tree": (2 * L, L + share),
                 "recursive_doubling": (L, share), "halving_doubling": (L, share)}
    elif op == "broadcast":
        table = {"ring": (L + p - 1, 2 * share), "tree": (L, L),
                 "recursive_doubling": (L, L), "halving_doubling": (2 * L, 2 * share)}
    elif op == "send_recv":
        one = np.ones_like(p)
        return one, one
    else:
        raise ValueError(f"unknown collective {op!r}")
    a, b = table[algorithm]
    return np.where(p > 1, a, 0.0), np.where(p > 1, b, 0.0)


def _time(op, nbytes, world_size, alpha, beta, algorithm):
    a, b = _terms(op, world_size, algorithm, nbytes)
    t = a * alpha + b * np.asarray(nbytes, dtype=float) * beta
    return float(t) if np.ndim(t) == 0 else t


def allreduce_time(nbytes, world_size, alpha, beta, algorithm="ring"):
    """Seconds for an all-reduce of ``nbytes`` per rank over ``world_size`` ranks."""
    return _time("allreduce", nbytes, world_size, alpha, beta, algorithm)


def reduce_scatter_time(nbytes, world_size, alpha, beta, algorithm="ring"):
    """Seconds for a reduce-scatter whose full input is ``nbytes`` (each rank keeps 1/p)."""
    return _time("reduce_scatter", nbytes, world_size, alpha, beta, algorithm)


def all_gather_time(nbytes, world_size, alpha, beta, algorithm="ring"):
    """Seconds for an all-gather whose full output is ``nbytes`` (each rank brings 1/p)."""
    return _time("all_gather", nbytes, world_size, alpha, beta, algorithm)


def broadcast_time(nbytes, world_size, alpha, beta, algorithm="ring"):
    """Seconds to broadcast ``nbytes`` from one rank to ``world_size - 1`` others."""
    return _time("broadcast", nbytes, world_size, alpha, beta, algorithm)


def send_recv_time(nbytes, world_size, alpha, beta, algorithm="ring"):
    """Seconds for one point-to-point message of ``nbytes``: alpha + n beta (any world size)."""
    return _time("send_recv", nbytes, np.maximum(2, world_size), alpha, beta, algorithm)


COLLECTIVES = {"allreduce": allreduce_time, "all_reduce": allreduce_time,
               "reduce_scatter": reduce_scatter_time, "all_gather": all_gather_time,
               "broadcast": broadcast_time, "send_recv": send_recv_time}


def collective_time(op, nbytes, world_size, alpha, beta, algorithm="ring"):
    """Seconds for collective ``op`` (a key of ``COLLECTIVES``)."""
    if op not in COLLECTIVES:
        raise ValueError(f"unknown collective {op!r}; use one of {', '.join(COLLECTIVES)}")
    return COLLECTIVES[op](nbytes, world_size, alpha, beta, algorithm)


# ---- fitting alpha and beta to measurements ------------------------------------------------

def _seconds(values):
    """Accept floats or ``lu.timing.Stats`` (their median is used)."""
    return np.array([getattr(v, "median", v) for v in values], dtype=float)


def fit(nbytes, seconds, world_size, algorithm="ring", op="allreduce", relative=True):
    """Least-squares ``(alpha, beta)`` (seconds, seconds per byte) from measured times.

    ``nbytes`` and ``seconds`` are sequences of equal length (``seconds`` may hold
    ``lu.timing.Stats``; their medians are used); ``world_size`` is one int or one per point.
    The model ``t = A(p) alpha + B(p) n beta`` is linear in (alpha, beta). With
    ``relative=True`` each point is weighted by 1/t, i.e. relative errors are minimised: a
    sweep from 1 KiB to 64 MiB spans five decades, and plain least squares would let the
    largest message alone decide both parameters. Both are kept >= 0.
    """
    n = np.asarray(nbytes, dtype=float)
    t = _seconds(seconds)
    if n.shape != t.shape or n.ndim != 1 or len(n) < 2:
        raise ValueError(f"fit needs two equal-length sequences of >= 2 points; got "
                         f"{n.shape[0] if n.ndim else 'scalar'} sizes and "
                         f"{t.shape[0] if t.ndim else 'scalar'} times")
    if np.any(t <= 0):
        raise ValueError("measured seconds must be > 0")
    p = np.broadcast_to(np.asarray(world_size), n.shape)
    if np.all(p == 1):
        raise ValueError("world_size=1 has no communication to fit; measure with >= 2 ranks")
    a, b = _terms(op, p, algorithm, n)
    X = np.stack([a, b * n], axis=1)
    w = 1.0 / t if relative else np.ones_like(t)
    coef = np.linalg.lstsq(X * w[:, None], t * w, rcond=None)[0]
    if coef[0] < 0 or coef[1] < 0:  # refit the one parameter the data supports
        cands = []
        for j in (0, 1):
            c = np.zeros(2)
            xj = X[:, j] * w
            c[j] = max(0.0, float(xj @ (t * w) / (xj @ xj))) if xj @ xj > 0 else 0.0
            cands.append((float(np.sum(((X @ c - t) * w) ** 2)), c))
        coef = min(cands, key=lambda x: x[0])[1]
    return float(coef[0]), float(coef[1])


def bandwidth(beta):
    """Bytes per second of a link whose inverse bandwidth is ``beta`` (s/B)."""
    return math.inf if beta == 0 else 1.0 / beta
