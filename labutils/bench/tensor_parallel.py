"""Benchmark ``tensor_parallel``: one transformer layer's step, tensor-parallel and
data-parallel on 2 ranks against 1 rank (``experiments.tp_timing``)."""
from labutils.bench.suite import Row
from labutils.core.timing import compare
from labutils.experiments.tp_timing import run as run_timing


def run(quick=False):
    """One transformer layer (hidden 256, 8 heads), forward and backward on a global batch of
    8 x 64 tokens: 1 rank, TP on 2 ranks, DP (PyTorch's DDP, 1 MB buckets) on 2 ranks, cores // 2
    threads per rank, interleaved. Ratios of step times (1 rank / variant: above 1 is a speedup):
    the median per-round ratio with its 95% interval (``timing.compare``, paired rounds).

    No speed target on CPU: whether either split pays off depends on gloo's all-reduce time
    against the compute it saves, and on the machine's load. On GPUs joined by NVLink the
    TP speedup of a layer this small is still capped by its 4 all-reduces per step on the
    critical path; at real widths it approaches, never reaches, 2.
    """
    res = run_timing(world_size=2, repeats=2 if quick else 9)
    s = res["stats"]
    if not (res["tp_equal"] and res["dp_equal"]):
        raise AssertionError("a parallel step differs from the one-rank step")

    def paired(a, b):        # the variants ran round by round in lock-step: the rounds pair
        return compare(s[a].values, s[b].values, paired=True)
    tp, dp, tp_dp = paired("1 rank", "TP"), paired("1 rank", "DP"), paired("TP", "DP")
    return [Row("tensor_parallel", "speedup of TP on 2 ranks over 1 rank", tp.ratio, "x",
                f"{tp.fmt()}; all-reduces per step (forward, backward): {res['calls']['TP']}; "
                f"{res['threads']} thread(s) per rank"),
            Row("tensor_parallel", "speedup of DP on 2 ranks over 1 rank", dp.ratio, "x",
                f"{dp.fmt()}; all-reduces per step (forward, backward): {res['calls']['DP']}"),
            Row("tensor_parallel", "TP step / DP step", tp_dp.ratio, "ratio",
                f"{tp_dp.fmt()}; below 1: TP faster; TP's all-reduces wait on the critical "
                "path, DP's overlap backward")]
