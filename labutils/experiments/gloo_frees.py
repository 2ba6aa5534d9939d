"""Collectives whose buffers are freed where ``core.memory.measure_peak`` sees it (06c).

``measure_peak`` replays the allocator's reports to the profiler, which only listens on the
thread that started it. gloo runs a collective on its own worker thread and its ``Work`` holds
the collective's tensors; when that thread drops the last reference, the free goes unreported,
the replay never sees those bytes come back and the peak creeps up by one buffer per miss,
differently on every run: 20 all-gathers of 256 KiB in a row on 2 ranks peaked at 2.1 and 4.0
MiB, one alone at 640 KiB (output, input, gloo's flat output buffer); inside
``frees_on_this_thread`` 20 peak as one does (``tests/test_zero_training.py``; in 12 idle runs
of 40 reduce-scatters none was missed; once, on a machine loaded by other processes, one free
in 20 was, one buffer too many: the bookkeeping narrows the gap, it does not prove it closed).

``frees_on_this_thread()`` makes this thread the last owner of every buffer, for the two
collectives ZeRO uses, without changing what they compute or send:

* ``all_gather_single``: the real call; after ``wait`` it holds the input and output until
  gloo's thread has let go of them (microseconds), then returns.
* ``reduce_scatter_single``: gloo on CPU implements it as a clone of the input, an all-reduce
  of the clone and a copy of this rank's slice out of it (``ProcessGroupGloo::
  reduce_scatter_tensor_coalesced`` in torch 2.13; one call of 1 MiB peaks at input + output
  + a 1 MiB copy, measured). The stand-in runs exactly those three steps here, so the clone it
  frees is one this thread owns: the same bytes allocated, the same all-reduce on the wire
  (gloo's reduce-scatter sends what an all-reduce sends; NCCL's ring reduce-scatter half).
"""
import contextlib
import time

import torch.distributed as dist


class _Done:
    """The handle of a collective that has completed already."""
    def wait(self, timeout=None):
        return True


def _run_then_release(collective, *tensors):
    """Run ``collective()`` (a gloo call with ``async_op=True``), wait for it, then wait until
    gloo's worker thread has dropped its references to ``tensors``, so that this thread is the
    one that frees them."""
    counts = [t._use_count() for t in tensors]
    collective().wait()
    deadline = time.perf_counter() + 1.0  # never block a run on bookkeeping
    while (any(t._use_count() > c for t, c in zip(tensors, counts))
           and time.perf_counter() < deadline):
        time.sleep(0)


@contextlib.contextmanager
def frees_on_this_thread():
    """Within: gloo's all-gather and reduce-scatter leave every buffer to this thread to free,
    where the profiler sees it (see the module docstring). Restores both on exit."""
    gather, scatter = dist.all_gather_single, dist.reduce_scatter_single

    def all_gather(output, input, group=None, async_op=False):
        _run_then_release(lambda: gather(output, input, group=group, async_op=True),
                          output, input)
        return _Done() if async_op else None  # FSDP2 asks async: done already, same order

    def reduce_scatter(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        buffer = input.clone()  # gloo's own first step
        _run_then_release(lambda: dist.all_reduce(buffer, op=op, group=group, async_op=True),
                          buffer)
        output.copy_(buffer.chunk(dist.get_world_size(group))[dist.get_rank(group)])
        return _Done() if async_op else None

    dist.all_gather_single, dist.reduce_scatter_single = all_gather, reduce_scatter
    try:
        yield
    finally:
        dist.all_gather_single, dist.reduce_scatter_single = gather, scatter
