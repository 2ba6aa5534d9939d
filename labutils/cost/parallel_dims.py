"""One layout for composed parallelism: ``ParallelDims(dp, tp, pp, cp)`` (06e_composed_parallelism).

The ranks form a 4-D grid of shape ``(pp, dp, cp, tp)``, row-major, as torchtitan's
``ParallelDims`` orders its mesh: rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank.
Tensor parallelism is the innermost (fastest-varying) axis, so a tensor-parallel group is
``tp`` *consecutive* ranks: launched node by node, consecutive ranks share a node, and TP, which
all-reduces activations four times per layer on the critical path, gets NVLink. Pipeline
parallelism is the outermost: it sends one activation per micro-batch, point to point, and
tolerates the slowest links (between nodes).

Everything here but ``build_mesh`` is pure arithmetic on the layout, usable before any process
starts (``validate``) or by a test that checks it against ``init_device_mesh``'s groups: it
lives in ``cost/`` so that the planner's ``planspec.Layout`` is the same layout
(``Layout.dims``); ``build_mesh`` imports ``torch.distributed`` only when a rank calls it. A
rank's place is a ``RankCoords``; it has the attributes the pipeline executor
(``pipeline.run_schedule``) reads, so a stage of a composed run is driven by the same executor.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from labutils.core.i18n import tr

DIM_NAMES = ("pp", "dp", "cp", "tp")      # outermost to innermost: the mesh's dimension order


@dataclass(frozen=True)
class ParallelDims:
    """How many ways each kind of parallelism splits the world: dp * tp * pp * cp ranks."""
    dp: int
    tp: int
    pp: int
    cp: int = 1

    def __post_init__(self):
        for name in DIM_NAMES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(tr("ParallelDims: {name} must be a whole number >= 1 (1 means "
                                    "that kind of parallelism is off); got {value!r}.",
                                    name=name, value=value))

    @property
    def shape(self):
        """Sizes in mesh order (pp, dp, cp, tp)."""
        return tuple(getattr(self, name) for name in DIM_NAMES)

    @property
    def world_size(self):
        return prod(self.shape)

    def validate(self, world_size):
        """Refuse a layout that does not fill ``world_size`` ranks exactly, saying what to
        change; call it before launching. Returns ``self``."""
        if self.world_size != world_size:
            raise ValueError(tr(
                "ParallelDims(dp={dp}, tp={tp}, pp={pp}, cp={cp}) needs dp*tp*pp*cp = {need} "
                "ranks, but world_size is {world_size}. Launch {need} ranks, or choose sizes "
                "whose product is {world_size} (for example dp={world_size}, tp=1, pp=1, cp=1).",
                dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp, need=self.world_size,
                world_size=world_size))
        return self

    # ---- pure arithmetic: where a rank sits and who its neighbours are --------------------

    def coords(self, rank):
        """This rank's coordinate on each dimension (row-major over (pp, dp, cp, tp))."""
        if not 0 <= rank < self.world_size:
            raise ValueError(tr("rank {rank} is outside 0..{last} for a world of {n} ranks.",
                                rank=rank, last=self.world_size - 1, n=self.world_size))
        place, rest = {}, rank
        for name in reversed(DIM_NAMES):          # tp varies fastest: peel it off first
            size = getattr(self, name)
            place[name], rest = rest % size, rest // size
        return RankCoords(rank, self, place["pp"], place["dp"], place["cp"], place["tp"])

    def rank_of(self, pp=0, dp=0, cp=0, tp=0):
        """The rank at these coordinates (the inverse of ``coords``)."""
        rank = 0
        for name, coordinate in zip(DIM_NAMES, (pp, dp, cp, tp)):
            rank = rank * getattr(self, name) + coordinate
        return rank

    def group_ranks(self, rank, dim):
        """The ranks of ``rank``'s ``dim`` group: same coordinates on every other dimension,
        in order of their ``dim`` coordinate (so position i holds ``dim``-rank i)."""
        place = self.coords(rank).as_dict()
        return [self.rank_of(**{**place, dim: i}) for i in range(getattr(self, dim))]

    def groups(self, rank):
        """{dimension: ranks of this rank's group along it}, for every dimension."""
        return {dim: self.group_ranks(rank, dim) for dim in DIM_NAMES}

    def all_groups(self, dim):
        """Every group along ``dim`` (each once, by their first rank): what the mesh creates."""
        seen = {}
        for rank in range(self.world_size):
            ranks = self.group_ranks(rank, dim)
            seen.setdefault(ranks[0], ranks)
        return list(seen.values())

    # ---- inside a rank ----------------------------------------------------------------------

    def build_mesh(self, device="cpu"):
        """The DeviceMesh with named dimensions (every rank calls it; it creates the groups)."""
        from torch.distributed.device_mesh import init_device_mesh
        return init_device_mesh(device, self.shape, mesh_dim_names=DIM_NAMES)


@dataclass(frozen=True)
class RankCoords:
    """Where one rank sits: its coordinate on each dimension, and its pipeline neighbours."""
    rank: int
    dims: ParallelDims
    pp_rank: int
    dp_rank: int
    cp_rank: int
    tp_rank: int

    def as_dict(self):
        return {"pp": self.pp_rank, "dp": self.dp_rank, "cp": self.cp_rank, "tp": self.tp_rank}

    @property
    def world_size(self):
        return self.dims.world_size

    @property
    def pp_is_first_stage(self):
        return self.pp_rank == 0

    @property
    def pp_is_last_stage(self):
        return self.pp_rank == self.dims.pp - 1

    @property
    def prev_rank(self):
        """The rank holding the previous stage for the same data, sequence and tensor slice."""
        if self.pp_is_first_stage:
            return None
        return self.dims.rank_of(**{**self.as_dict(), "pp": self.pp_rank - 1})

    @property
    def next_rank(self):
        if self.pp_is_last_stage:
            return None
        return self.dims.rank_of(**{**self.as_dict(), "pp": self.pp_rank + 1})
