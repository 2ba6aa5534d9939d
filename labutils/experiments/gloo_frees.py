"""Collectives whose buffers are freed where ``core.memory.measure_peak`` sees it (06c).

``measure_peak`` replays the allocator's reports to the profiler, which only listens on the
thread that started it. gloo runs a collective on its own worker thread, and that thread holds
references to the collective's tensors for a while after ``wait()`` returns (some ~ms, after
the tensors' own reference counts are back to what they were: measured). When the caller drops
a tensor inside that window, gloo's thread frees it, the free goes unreported and the peak
creeps up by one buffer per miss, differently on every run: 20 all-gathers of 256 KiB in a row
on 2 ranks peaked at 2.1 and 4.0 MiB, one alone at 640 KiB (output, input, gloo's flat output
buffer). Waiting for the reference counts to fall is not enough: it missed about one free in
160 calls (one in 40 runs of 40 calls on an idle machine, twice in 20 calls once in CI).

``frees_on_this_thread()`` closes the window for the three collectives data parallelism and
ZeRO use, without changing what they compute or send, so that every byte a measured run
allocates is freed by the thread that allocated it:

* ``all_reduce`` and ``all_gather_single``: gloo gets *aliases* of the caller's tensors,
  tensors over the same bytes whose storage does not own them (a storage made from the data
  pointer, with no deleter). gloo's thread may keep and drop the aliases whenever it likes:
  dropping one frees nothing and runs no Python. The caller's own storages never reach gloo's
  thread. Each call is waited for before it returns, so the bytes outlive every use gloo makes
  of them.
* ``reduce_scatter_single``: gloo on CPU implements it as a clone of the input, an all-reduce
  of the clone and a copy of this rank's slice out of it (``ProcessGroupGloo::
  reduce_scatter_tensor_coalesced`` in torch 2.13; one call of 1 MiB peaks at input + output
  + a 1 MiB copy, measured). The stand-in runs exactly those three steps here, the all-reduce
  on an alias of the clone, so the clone is freed here: the same bytes allocated, the same
  all-reduce on the wire (gloo's reduce-scatter sends what an all-reduce sends; NCCL's ring
  reduce-scatter half).

gloo's own scratch buffers are allocated and freed inside the work, where PyTorch propagates
the profiler to gloo's thread, so they are seen as before. Within, the three calls accept
contiguous CPU tensors only (what these runs pass); anything else is refused, naming the fix.
"""
import contextlib

import torch
import torch.distributed as dist


class _Done:
    """The handle of a collective that has completed already (``output``: what its future
    holds, as for gloo's own handles)."""
    def __init__(self, output):
        self.output = output

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def get_future(self):
        future = torch.futures.Future()
        future.set_result([self.output])
        return future


def _alias(t):
    """A tensor over ``t``'s bytes whose storage does not own them: freeing it frees nothing,
    and runs no Python (no GIL needed on gloo's thread). An empty tensor gets an empty one of
    its own, so not even an empty view hands ``t``'s storage to gloo."""
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("frees_on_this_thread handles contiguous CPU tensors only; "
                         f"got a {'non-contiguous' if t.device.type == 'cpu' else t.device.type}"
                         " tensor: pass .contiguous() (CPU) or measure without it")
    if t.numel() == 0:
        return torch.empty(t.shape, dtype=t.dtype)
    storage = torch._C._construct_storage_from_data_pointer(t.data_ptr(), t.device, t.nbytes)
    return torch.empty(0, dtype=t.dtype).set_(storage, 0, t.shape, t.stride())


def _wait(work):
    if work is not None:           # None: this rank is not in the group, as for the real call
        work.wait()


@contextlib.contextmanager
def frees_on_this_thread():
    """Within: gloo's all-reduce, all-gather and reduce-scatter leave every buffer to this
    thread to free, where the profiler sees it (see the module docstring). Restores all three
    on exit."""
    reduce, gather, scatter = dist.all_reduce, dist.all_gather_single, dist.reduce_scatter_single

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        _wait(reduce(_alias(tensor), op=op, group=group, async_op=True))
        return _Done(tensor) if async_op else None  # done already, same order

    def all_gather(output_tensor, input_tensor, group=None, async_op=False):
        _wait(gather(_alias(output_tensor), _alias(input_tensor), group=group, async_op=True))
        torch.autograd.graph.increment_version(output_tensor)  # written, as gloo's call marks it
        return _Done(output_tensor) if async_op else None  # FSDP2 asks async: done already

    def reduce_scatter(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        buffer = input.clone()  # gloo's own first step
        all_reduce(buffer, op=op, group=group)
        output.copy_(buffer.chunk(dist.get_world_size(group))[dist.get_rank(group)])
        return _Done(output) if async_op else None

    dist.all_reduce, dist.all_gather_single, dist.reduce_scatter_single = (
        all_reduce, all_gather, reduce_scatter)
    try:
        yield
    finally:
        dist.all_reduce, dist.all_gather_single, dist.reduce_scatter_single = (
            reduce, gather, scatter)
