"""The alpha-beta cost model of collectives, its fit to measurements, named links and the
bandwidth figures nccl-tests reports.

Used by 03a2 (fit alpha and beta to measured all-reduce times, with residuals; where the
fastest algorithm changes), 04c (predicted vs measured
speedup, with ``step_time``) and 07 (the model calibrated here predicts scale; ``lu.planner``
builds on ``step_time`` at the end).

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
reduce-scatter (p-1) a + (p-1)/p n b                        recursive_doubling/halving_doubling:
all-gather     (p-1) a + (p-1)/p n b                          L a + (p-1)/p n b
                                                            tree (via a root): 2 L a + (L + (p-1)/p) n b
broadcast      (L + p-1) a + 2(p-1)/p n b (scatter+ring)    tree / recursive_doubling: L (a + n b)
                                                            halving_doubling: 2 L a + 2(p-1)/p n b
all-to-all     (p-1) a + (p-1)/p n b (pairwise exchange)    recursive_doubling (Bruck): L a + L/2 n b
send/recv      a + n b                                      (same)
=============  ==========================================  ====================================

with p = world_size, L = ceil(log2 p). Every collective costs 0 when p = 1. For all-to-all,
``nbytes`` is one rank's whole send buffer (its own 1/p included); "ring" names the pairwise
exchange (p-1 rounds, one block of n/p to one peer each; Thakur et al. 2005, section 4.5) and
Bruck et al. (1997) the log-round variant.

Emulated links (``emulate``, ``emulated_allreduce_hook``) live in ``labutils.parallel.emulation``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from labutils.core.i18n import N_

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
    elif op == "all_to_all":
        table = {"ring": (p - 1, share), "recursive_doubling": (L, L / 2)}
        if algorithm not in table:
            raise ValueError(f"all-to-all is modelled as 'ring' (pairwise exchange) or "
                             f"'recursive_doubling' (Bruck); got {algorithm!r}")
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


def all_to_all_time(nbytes, world_size, alpha, beta, algorithm="ring"):
    """Seconds for an all-to-all in which each rank sends ``nbytes`` (1/p to each rank)."""
    return _time("all_to_all", nbytes, world_size, alpha, beta, algorithm)


def send_recv_time(nbytes, world_size, alpha, beta, algorithm="ring"):
    """Seconds for one point-to-point message of ``nbytes``: alpha + n beta (any world size)."""
    return _time("send_recv", nbytes, np.maximum(2, world_size), alpha, beta, algorithm)


COLLECTIVES = {"allreduce": allreduce_time, "all_reduce": allreduce_time,
               "reduce_scatter": reduce_scatter_time, "all_gather": all_gather_time,
               "broadcast": broadcast_time, "all_to_all": all_to_all_time,
               "send_recv": send_recv_time}


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


def residuals(nbytes, seconds, world_size, alpha, beta, algorithm="ring", op="allreduce"):
    """Relative residuals of a fit, one per point: measured / modelled - 1 (0 is a perfect fit;
    +0.5 means the measurement took 1.5 times the model's time)."""
    t = _seconds(seconds)
    model = collective_time(op, np.asarray(nbytes, dtype=float), world_size, alpha, beta,
                            algorithm)
    return t / np.asarray(model, dtype=float) - 1.0


def decades(values):
    """How many powers of ten positive ``values`` span (log10 of max / min); inf when some are
    0, as a fit forced to beta = 0 is. More than 1: the values disagree by over 10x."""
    v = np.asarray(values, dtype=float)
    if np.any(v <= 0):
        return math.inf
    return float(np.log10(v.max() / v.min()))


# ---- which algorithm is fastest, and where that changes -----------------------------------

def allreduce_crossover(world_size, alpha, beta, first, second):
    """The message size (bytes) at which all-reduce ``first`` and ``second`` take equal time:
    ``(A2 - A1) alpha / ((B1 - B2) beta)`` from ``t = A alpha + B n beta``. Below it the one
    with fewer alpha terms wins, above it the one with the smaller byte factor; ``inf`` when
    one is never slower (fewer or equal alpha terms and a byte factor no larger)."""
    a1, b1 = (float(x) for x in _terms("allreduce", world_size, first))
    a2, b2 = (float(x) for x in _terms("allreduce", world_size, second))
    if (a1 - a2) * (b1 - b2) >= 0:   # one has no more of both terms: the lines never cross
        return math.inf
    return (a2 - a1) * alpha / ((b1 - b2) * beta)


def fastest_allreduce(nbytes, world_size, alpha, beta, algorithms=("ring", "recursive_doubling",
                                                                     "halving_doubling")):
    """The algorithm (of ``algorithms``) the model gives the least time at ``nbytes``; ties go
    to the one listed first."""
    times = [allreduce_time(nbytes, world_size, alpha, beta, a) for a in algorithms]
    return algorithms[int(np.argmin(times))]


def bandwidth(beta):
    """Bytes per second of a link whose inverse bandwidth is ``beta`` (s/B)."""
    return math.inf if beta == 0 else 1.0 / beta


# ---- named links ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Link:
    """A network tier: ``bandwidth`` in bytes/s per direction, ``latency`` in s per message."""
    name: str
    bandwidth: float
    latency: float
    note: str = ""

    @property
    def alpha(self):
        return self.latency

    @property
    def beta(self):
        return 1.0 / self.bandwidth


# Line rates are the standards' (1 Gb/s = 125e6 B/s); latencies are typical small-message
# figures for the stack named (assumed round numbers, not measured here).
LINKS = {link.name: link for link in (
    Link("1GbE", 125e6, 50e-6, N_("Gigabit Ethernet, TCP")),
    Link("10GbE", 1.25e9, 20e-6, N_("10 Gigabit Ethernet, TCP")),
    Link("25GbE", 3.125e9, 10e-6, N_("25 Gigabit Ethernet, TCP")),
    Link("100Gb-IB", 12.5e9, 5e-6, N_("EDR InfiniBand, one adapter")),
    Link("200Gb-IB", 25e9, 5e-6, N_("HDR InfiniBand, one adapter per GPU (DGX A100)")),
    Link("PCIe4", 25e9, 5e-6, N_("PCIe 4.0 x16, GPU to GPU through the host")),
    Link("NVLink-V100", 150e9, 3e-6, N_("V100 NVLink2/NVSwitch, 150 GB/s each way")),
    Link("NVLink", 300e9, 3e-6, N_("A100 NVLink3/NVSwitch, 300 GB/s each way")),
)}


def get_link(link):
    """A ``Link`` from a name in ``LINKS``, a ``Link``, or an ``(alpha, beta)`` pair."""
    if isinstance(link, Link):
        return link
    if isinstance(link, str):
        if link not in LINKS:
            raise ValueError(f"unknown link {link!r}; use one of {', '.join(LINKS)}, a "
                             f"costmodel.Link(name, bandwidth, latency) or an (alpha, beta) pair")
        return LINKS[link]
    if isinstance(link, (tuple, list)) and len(link) == 2:
        alpha, beta = (float(x) for x in link)
        if alpha < 0 or beta <= 0:
            raise ValueError(f"(alpha, beta) must have alpha >= 0 and beta > 0; got {link!r}")
        return Link(f"fitted ({alpha * 1e6:.3g} us, {1e-9 / beta:.3g} GB/s)", 1 / beta, alpha)
    raise TypeError(f"link must be a name ({', '.join(LINKS)}), a Link or (alpha, beta); "
                    f"got {link!r}")



# ---- the figures nccl-tests reports ----------------------------------------------------------

def algorithm_bandwidth(nbytes, seconds):
    """nccl-tests' algbw: the tensor's size over the time, bytes/s."""
    return nbytes / seconds


def bus_bandwidth(nbytes, seconds, world_size):
    """nccl-tests' busbw for all-reduce, bytes/s: algbw * 2(p-1)/p, what each link carries under
    a bandwidth-optimal algorithm, so it is comparable across world sizes."""
    if world_size < 2:
        raise ValueError("bus bandwidth needs world_size >= 2")
    return algorithm_bandwidth(nbytes, seconds) * 2 * (world_size - 1) / world_size


def ring_allreduce_time(nbytes, world_size, alpha, beta):
    """Reference solution of the exercise: 2(p-1) alpha + 2(p-1)/p n beta."""
    p = world_size
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta
