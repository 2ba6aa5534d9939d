"""Checker for 06e_composed_parallelism: a rank's coordinates and groups on a (pp, dp, cp, tp)
mesh, worked out by hand (pure arithmetic: no processes), against ``ParallelDims``. The learner
gets a plain namespace of the four sizes, not a ``ParallelDims``: its ``coords`` and ``groups``
would answer the exercise."""
from __future__ import annotations

from types import SimpleNamespace

from labutils.core.i18n import tr
from labutils.exercises.base import CheckResult, call_learner, require_function
from labutils.cost.parallel_dims import DIM_NAMES, ParallelDims

__all__ = ["check_rank_coords", "rank_coords"]


def rank_coords(rank, dims):
    """(coords, groups) of ``rank``: {dim: coordinate} and {dim: ranks of its group along dim},
    row-major over (pp, dp, cp, tp), tp varying fastest."""
    sizes = {"pp": dims.pp, "dp": dims.dp, "cp": dims.cp, "tp": dims.tp}
    coords, strides, rest, stride = {}, {}, rank, 1
    for dim in ("tp", "cp", "dp", "pp"):                 # innermost first
        coords[dim], rest = rest % sizes[dim], rest // sizes[dim]
        strides[dim], stride = stride, stride * sizes[dim]
    groups = {dim: [rank + (i - coords[dim]) * strides[dim] for i in range(sizes[dim])]
              for dim in sizes}
    return coords, groups


def _column_major(rank, dims):
    """The classic mistake: pp varying fastest (the shape read backwards)."""
    flipped = ParallelDims(dp=dims.cp, tp=dims.pp, pp=dims.tp, cp=dims.dp)   # (tp, cp, dp, pp)
    coords, groups = rank_coords(rank, flipped)
    rename = {"pp": "tp", "dp": "cp", "cp": "dp", "tp": "pp"}
    return ({rename[d]: v for d, v in coords.items()},
            {rename[d]: v for d, v in groups.items()})


# Not the notebook's worked example (dp=2, tp=2, pp=2, rank 5): its answer is printed there.
_CASES = ((ParallelDims(dp=4, tp=2, pp=1), 5), (ParallelDims(dp=3, tp=2, pp=2), 7),
          (ParallelDims(dp=2, tp=4, pp=2), 6), (ParallelDims(dp=2, tp=2, pp=1, cp=2), 3),
          (ParallelDims(dp=2, tp=2, pp=3), 9), (ParallelDims(dp=4, tp=1, pp=2), 0))


def _diagnose(part, got, want, col, rank):
    """Why ``got`` (coords or groups) differs from ``want``, in whole sentences."""
    if got == col:
        return tr("That is the column-major answer, with pp varying fastest. The mesh is "
                  "row-major over (pp, dp, cp, tp): tp varies fastest, so a tensor-parallel "
                  "group is consecutive ranks, and pp slowest.")
    if part == "coords":
        if all(got.get(d) == want[d] + 1 for d in want):
            return tr("Every coordinate is one too large: coordinates count from 0, as ranks "
                      "do.")
        wrong = [d for d in want if got.get(d) != want[d]]
        return tr("The coordinate on {dims} is wrong. Peel the dimensions off from the "
                  "innermost: tp = rank % tp, then divide by tp, and so on outwards.",
                  dims=", ".join(wrong))
    for d in want:
        g, w = list(got.get(d, [])), want[d]
        if g == w:
            continue
        if g == [r + 1 for r in w]:
            return tr("The {dim} group is shifted by one: ranks count from 0.", dim=d)
        if sorted(g) == w:
            return tr("The {dim} group has the right ranks in the wrong order: list them by "
                      "their {dim} coordinate, so that position i holds {dim}-rank i.", dim=d)
        if rank not in g:
            return tr("The {dim} group leaves out rank {rank} itself: a group holds every rank "
                      "that differs from it only along {dim}, itself included.", dim=d, rank=rank)
        if len(g) != len(w):
            return tr("The {dim} group has {n} ranks but the layout has {dim}={size}: one group "
                      "holds exactly {size} ranks (an off-by-one in the range?).",
                      dim=d, n=len(g), size=len(w))
        return tr("The {dim} group is wrong: its ranks differ from rank {rank} only in the {dim} "
                  "coordinate, a stride apart (the product of the sizes inside {dim}).",
                  dim=d, rank=rank)
    return tr("Return a group for each of pp, dp, cp and tp.")


def check_rank_coords(learner_fn):
    """Check ``learner_fn(rank, dims) -> (coords, groups)`` on several layouts (no processes)."""
    require_function("rank_coords", learner_fn)
    for number, (dims, rank) in enumerate(_CASES, 1):
        case = f"rank={rank}, dp={dims.dp}, tp={dims.tp}, pp={dims.pp}, cp={dims.cp}"
        where = tr("[wrong] {name}: case {number} of {total} ({case})", name="rank_coords",
                   number=number, total=len(_CASES), case=case)
        sizes = SimpleNamespace(pp=dims.pp, dp=dims.dp, cp=dims.cp, tp=dims.tp)  # sizes only
        got, failed = call_learner("rank_coords", learner_fn, where, rank, sizes)
        if failed:
            return failed
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(p, dict)
                                                                 for p in got)):
            return CheckResult(False, tr("{where}: expected a pair (coords, groups) of two "
                                         "dicts keyed by 'pp', 'dp', 'cp' and 'tp'; got "
                                         "{type}.", where=where, type=type(got).__name__))
        want, col = rank_coords(rank, dims), _column_major(rank, dims)
        for i, part in enumerate(("coords", "groups")):
            g = {d: (list(v) if part == "groups" and isinstance(v, (list, tuple, range)) else v)
                 for d, v in got[i].items()}
            if any(g.get(d) != want[i][d] for d in DIM_NAMES):
                why = _diagnose(part, g, want[i], col[i], rank)
                return CheckResult(False, tr("{where}: {part} expected {e}, got {g}. {why}",
                                             where=where, part=part, e=want[i], g=got[i],
                                             why=why), {"rank": rank, "dims": dims})
    return CheckResult(True, tr("[ok] {name}: {total} cases passed", name="rank_coords",
                                total=len(_CASES)))
