"""Whether a layout can run a model: the checks ``labutils.cost.planner.predict`` makes before
it predicts anything (degrees that divide what they split, stages that hold the layers, a batch
that divides into micro-batches, interleaving's and context parallelism's constraints), each
with an error that names the fix.
"""
from __future__ import annotations

from labutils.cost import long_context as lc


def validate_layout(model, layout, batch_size):
    """The layers of each pipeline stage and the micro-batches per pipeline of ``layout``
    for ``model`` and ``batch_size``; a ValueError that names the fix if the layout cannot
    run (before any prediction or process starts)."""
    L = layout
    L.dims   # dp, tp, pp and cp checked as every mesh of the course checks them (ParallelDims)
    if min(L.micro_batch, L.virtual_stages) < 1:
        raise ValueError(f"micro_batch and virtual_stages must be >= 1; got {layout}")
    if L.zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0, 1, 2 or 3; got {L.zero!r}")
    kv_heads = model.num_kv_heads or model.num_heads
    if model.num_heads % L.tp or kv_heads % L.tp:
        raise ValueError(f"tp={L.tp} must divide num_heads={model.num_heads} and "
                         f"num_kv_heads={kv_heads}")
    if L.pp > model.num_layers:
        raise ValueError(f"pp={L.pp} stages for {model.num_layers} layers: use pp <= num_layers")
    stages = L.layers_per_stage(model.num_layers)
    if len(stages) != L.pp or sum(stages) != model.num_layers or min(stages) < 1:
        raise ValueError(f"stage_layers={stages} must give pp={L.pp} positive layer counts "
                         f"summing to num_layers={model.num_layers}")
    # a chunk holds at least one layer, except the first stage's first chunk and the last
    # stage's last, which may hold only the embedding or the output layer (Llama 3, Sec. 3.3.2)
    inner = stages[1:-1] or (L.virtual_stages,)
    if L.virtual_stages > 1 and (L.pp == 1 or min(inner) < L.virtual_stages
                                 or min(stages[0], stages[-1]) < L.virtual_stages - 1):
        raise ValueError(f"virtual_stages={L.virtual_stages} needs pp > 1 and at least that "
                         f"many layers on each stage {stages} (one fewer on the first and last)")
    if model.seq_len % L.context_parallel:
        raise ValueError(f"context_parallel={L.context_parallel} must divide "
                         f"seq_len={model.seq_len}")
    if L.sequence_parallel and L.tp == 1:
        raise ValueError("sequence_parallel splits the tensor-parallel group's LayerNorm and "
                         "dropout work: set tp > 1, or sequence_parallel=False")
    if L.context_algorithm not in ("ring", "ulysses"):
        raise ValueError(f"context_algorithm must be 'ring' or 'ulysses'; got "
                         f"{L.context_algorithm!r}")
    if L.context_algorithm == "ulysses":
        lc.ulysses_kv_heads(model.num_heads // L.tp, 1, L.context_parallel)
    if L.expert_parallel < 1 or L.expert_parallel > 1 and model.num_experts == 1:
        raise ValueError(f"expert_parallel={L.expert_parallel} needs a mixture-of-experts "
                         f"model (Transformer(num_experts=...)) and must be >= 1; use 1 for a "
                         f"dense model")
    if model.num_experts % L.expert_parallel or (L.dp * L.context_parallel) % L.expert_parallel:
        raise ValueError(f"expert_parallel={L.expert_parallel} must divide num_experts="
                         f"{model.num_experts} and dp x context_parallel = "
                         f"{L.dp * L.context_parallel} (its ranks come from that group)")
    if batch_size % (L.dp * L.micro_batch):
        raise ValueError(f"batch_size={batch_size} must be a multiple of dp x micro_batch = "
                         f"{L.dp * L.micro_batch}")
    m = batch_size // (L.dp * L.micro_batch)
    if L.virtual_stages > 1 and m % L.pp:
        raise ValueError(f"the interleaved schedule needs the micro-batches per pipeline "
                         f"({m}) to be a multiple of pp={L.pp}")
    return stages, m
