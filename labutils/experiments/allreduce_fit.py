"""The alpha-beta fit of this machine's all-reduce: time all-reduces of a sweep of sizes on
real ranks, fit alpha and beta on some sizes and hold the others out (04c, 07, ``bench``)."""
import contextlib
import time

from labutils.core.launcher import launch
from labutils.core.timing import Stats, slowest
from labutils.cost import costmodel as cm
from labutils.parallel.emulation import emulate


def _allreduce_sweep(rank, world_size, sizes, repeats, link, per_sample=0.03):
    """Seconds per gloo all-reduce, per size: each sample is the mean of back-to-back calls
    filling about ``per_sample`` seconds (as nccl-tests times a loop of iterations: one call
    after a barrier mostly measures which rank left the barrier last). The same for the
    all-reduce emulated on ``link``. Sizes and plain/emulated are interleaved."""
    import torch
    import torch.distributed as dist

    bufs = {n: torch.ones(n // 4) for n in sizes}
    plain = {n: [] for n in sizes}
    emulated = {n: [] for n in sizes}
    emulator = emulate(link)
    calls = {}
    for n in sizes:  # warm-up (gloo sets up its buffers on the first call of each size) and
        dist.barrier()  # a first timing that sets how many calls fill one sample
        t0 = time.perf_counter()
        for _ in range(3):
            dist.all_reduce(bufs[n])
        once = torch.tensor([(time.perf_counter() - t0) / 3])
        dist.all_reduce(once, op=dist.ReduceOp.MAX)   # every rank must make the same calls
        calls[n] = max(1, min(50, round(per_sample / once.item())))
    for _ in range(repeats):
        for n in sizes:
            for times, ctx in ((plain, None), (emulated, emulator)):
                k = calls[n] if ctx is None else 1   # an emulated call is long already
                with ctx or contextlib.nullcontext():
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(k):
                        dist.all_reduce(bufs[n])
                    times[n].append((time.perf_counter() - t0) / k)
    return plain, emulated


def allreduce_fit(sizes, repeats, link="1GbE", fit_from=1 << 20):
    """gloo's all-reduce on 2 real ranks (``_allreduce_sweep``; per sample the slowest rank),
    alpha-beta fitted on the even repeats of the sizes >= ``fit_from`` bytes. Returns
    ``(plain, emulated, alpha, beta, held_out)``: ``held_out(n)`` is the Stats of measured /
    predicted over the odd repeats of size ``n``, which the fit never saw."""
    per_rank = launch(_allreduce_sweep, sizes, repeats, link, world_size=2)
    plain, emulated = ({n: slowest([r[i][n] for r in per_rank]) for n in sizes} for i in (0, 1))
    # By default fit on the range the target covers (>= 1 MiB): below it gloo's time on
    # loopback is nearly flat (thread wake-ups), and one alpha-beta line cannot follow both
    # regimes; a caller whose messages are smaller fits from lower (fit_from).
    fit_sizes = [n for n in sizes if n >= fit_from]
    alpha, beta = cm.fit(fit_sizes, [Stats.of(plain[n][0::2]) for n in fit_sizes], 2)

    def held_out(n):
        predicted = cm.allreduce_time(n, 2, alpha, beta)
        return Stats.of([t / predicted for t in plain[n][1::2]])
    return plain, emulated, alpha, beta, held_out
