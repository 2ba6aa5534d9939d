"""labutils.cost.parallel_dims: every inconsistent layout refused before any process starts;
coordinates and groups computed without a process, for every rank of every layout up to 16 ranks,
and equal to the groups ``init_device_mesh`` creates on 8 real ranks."""
import itertools

import pytest

import labutils as lu
from labutils.cost.parallel_dims import DIM_NAMES, ParallelDims

pytestmark = pytest.mark.lab06e


def _layouts(max_world=16):
    for dp, tp, pp, cp in itertools.product(range(1, 5), repeat=4):
        if dp * tp * pp * cp <= max_world:
            yield ParallelDims(dp, tp, pp, cp)


@pytest.mark.parametrize("sizes", [(0, 2, 2), (2, -1, 2), (2, 2, 2, 0), (2.0, 2, 2),
                                   (True, 2, 2), ("2", 2, 2)])
def test_non_positive_or_non_integer_sizes_are_refused(sizes):
    with pytest.raises(ValueError, match="whole number >= 1"):
        ParallelDims(*sizes)


@pytest.mark.parametrize("dims", list(_layouts(8)), ids=str)
def test_every_world_size_but_the_product_is_refused(dims):
    assert dims.validate(dims.world_size) is dims
    for world_size in range(1, 17):
        if world_size != dims.world_size:
            with pytest.raises(ValueError, match=f"needs dp\\*tp\\*pp\\*cp = {dims.world_size} "
                                                 f"ranks, but world_size is {world_size}"):
                dims.validate(world_size)


def test_the_error_names_the_fix():
    with pytest.raises(ValueError) as err:
        ParallelDims(dp=2, tp=2, pp=2).validate(4)
    assert "Launch 8 ranks" in str(err.value) and "product is 4" in str(err.value)


@pytest.mark.parametrize("dims", list(_layouts()), ids=str)
def test_coordinates_are_row_major_with_tp_innermost(dims):
    expected = itertools.product(*(range(n) for n in dims.shape))   # row-major over the shape
    for rank, place in enumerate(expected):
        c = dims.coords(rank)
        assert (c.pp_rank, c.dp_rank, c.cp_rank, c.tp_rank) == place
        assert dims.rank_of(**c.as_dict()) == rank


@pytest.mark.parametrize("dims", list(_layouts()), ids=str)
def test_groups_partition_the_world_and_hold_the_rank(dims):
    for dim in DIM_NAMES:
        groups = dims.all_groups(dim)
        assert sorted(r for g in groups for r in g) == list(range(dims.world_size))
        assert all(len(g) == getattr(dims, dim) for g in groups)
    for rank in range(dims.world_size):
        c = dims.coords(rank)
        for dim, ranks in dims.groups(rank).items():
            assert ranks[getattr(c, f"{dim}_rank")] == rank
            others = [d for d in DIM_NAMES if d != dim]   # members differ only along dim
            assert {tuple(dims.coords(r).as_dict()[d] for d in others) for r in ranks} == \
                {tuple(c.as_dict()[d] for d in others)}


def test_tp_groups_are_consecutive_and_pp_neighbours_are_one_stage_apart():
    dims = ParallelDims(dp=2, tp=2, pp=2)
    assert dims.all_groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.all_groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.all_groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    c5 = dims.coords(5)
    assert (c5.pp_rank, c5.dp_rank, c5.tp_rank) == (1, 0, 1)
    assert c5.pp_is_last_stage and not c5.pp_is_first_stage
    assert (c5.prev_rank, c5.next_rank) == (1, None)
    assert dims.coords(1).next_rank == 5


def test_a_rank_outside_the_world_is_refused():
    with pytest.raises(ValueError, match="outside 0..7"):
        ParallelDims(2, 2, 2).coords(8)


# ---- against PyTorch's DeviceMesh on real ranks --------------------------------------------

def _mesh_groups(rank, world_size, dims):
    import torch.distributed as dist
    mesh = dims.build_mesh()
    return {"coords": {d: mesh.get_local_rank(d) for d in DIM_NAMES},
            "groups": {d: dist.get_process_group_ranks(mesh.get_group(d)) for d in DIM_NAMES}}


@pytest.mark.slow
@pytest.mark.parametrize("dims", [ParallelDims(dp=2, tp=2, pp=2), ParallelDims(dp=2, tp=2, pp=1,
                                                                               cp=2)], ids=str)
def test_coordinates_and_groups_equal_device_mesh(dims):
    results = lu.launch(_mesh_groups, dims, world_size=8, warn_oversubscription=False)
    for rank, res in enumerate(results):
        assert res["coords"] == dims.coords(rank).as_dict()
        assert res["groups"] == dims.groups(rank)


# ---- one layout: the planner's Layout is a ParallelDims ----------------------------------------

@pytest.mark.parametrize("dims", list(_layouts(8)), ids=str)
def test_the_planners_layout_is_the_same_parallel_dims(dims):
    from labutils.cost.planspec import Layout
    layout = Layout(dp=dims.dp, tp=dims.tp, pp=dims.pp, context_parallel=dims.cp, zero=1)
    assert layout.dims == dims and layout.world_size == dims.world_size
    with pytest.raises(ValueError, match="whole number >= 1"):
        Layout(dp=0, tp=2).dims
