"""The 2-D layout's run (formerly in 06c; 06e_composed_parallelism composes more): validate the
mesh, train on it on real ranks (``parallel.mesh_2d``), and assert every rank equal to
single-process training."""
import torch

from labutils.core.launcher import launch
from labutils.parallel.mesh_2d import mesh_2d_worker, mlp_train_single
from labutils.parallel.tensor_parallel import TPLayout, reference_shards, validate_tp_config


def run_mesh_2d(world_size=4, mesh_shape=(2, 2), hidden=16, batch=8, seq=4, steps=3, lr=0.05,
                seed=0):
    """Check the mesh, train on it, assert every rank equal to single-process training
    (losses, and each rank's weight shards equal to the matching slices)."""
    dp_size, tp_size = mesh_shape
    if dp_size * tp_size != world_size:
        raise ValueError(f"mesh {dp_size} x {tp_size} = {dp_size * tp_size} ranks but "
                         f"world_size is {world_size}: the mesh must cover every rank once; "
                         f"use a mesh_shape whose product is {world_size}")
    validate_tp_config(hidden, None, tp_size)
    if batch % dp_size:
        raise ValueError(f"batch {batch} does not split over {dp_size} data-parallel ranks; "
                         f"use a multiple of {dp_size}")
    results = launch(mesh_2d_worker, dp_size, tp_size, hidden, batch, seq, steps, lr,
                     seed, world_size=world_size, warn_oversubscription=False)
    ref = mlp_train_single(hidden, batch, seq, steps, lr, seed)
    for rank, res in enumerate(results):
        torch.testing.assert_close(res["losses"], ref["losses"])
        layout = TPLayout(res["tp_rank"], tp_size)
        for name, p in res["params"].items():
            torch.testing.assert_close(p, reference_shards(name, ref["params"][name], layout),
                                       msg=lambda m: f"rank {rank} {name}: {m}")
    return {"losses": ref["losses"], "coords": [(r["dp_rank"], r["tp_rank"]) for r in results],
            "shapes": {n: tuple(p.shape) for n, p in results[0]["params"].items()}}
