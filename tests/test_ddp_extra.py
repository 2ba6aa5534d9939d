"""lu.ddp beyond tests/test_ddp.py: (a) BucketedDDP with the shared-memory all-reduce as its
comm hook gives the gradients of the default (gloo) hook and of single-process training;
(b) HookedDDP with a parameter that no rank uses: no hang, that parameter keeps grad=None
(no all-reduce is issued for it), the used ones get the single-process gradient."""
import pytest
import torch
from torch import nn

import labutils as lu

STEPS, BATCH, SEED = 3, 12, 0
# float64 throughout: data parallelism sums each gradient in another order than one process,
# and in float64 any order agrees to ~1e-16 relative, so assert_close's float64 defaults
# (1e-7) hold on every CPU and math library while a missing 1/world_size or a wrong shard
# stays many orders beyond them. Where both sides sum 2 values (a + b == b + a), bitwise.
DTYPE = torch.float64


class Net(nn.Module):
    """Parameters from 1 to 16k numbers (several buckets at 0.02 MB, one of 64 KiB alone);
    ``aux`` is used only when ``use_aux`` is true. Defined here, not taken from the library,
    so the test depends on the DDP wrappers alone."""

    def __init__(self, d_in=16, hidden=64, d_out=4):
        super().__init__()
        self.embed = nn.Linear(d_in, hidden)
        self.scale = nn.Parameter(torch.ones(1))
        self.big = nn.Linear(hidden, 4 * hidden)
        self.head = nn.Linear(4 * hidden, d_out)
        self.aux = nn.Linear(hidden, d_out)

    def forward(self, x, use_aux=True):
        h = torch.relu(self.embed(x)) * self.scale
        out = self.head(torch.relu(self.big(h)))
        return out + self.aux(h) if use_aux else out


def _batches(d_in=16, d_out=4):
    """The same regression batches in every process."""
    g = torch.Generator().manual_seed(SEED + 1)
    return [(torch.randn(BATCH, d_in, generator=g, dtype=DTYPE),
             torch.randn(BATCH, d_out, generator=g, dtype=DTYPE)) for _ in range(STEPS)]


def _step_loss(model, X, y, use_aux):
    return nn.functional.mse_loss(model(X, use_aux=use_aux), y)


def _reference(use_aux_fn):
    """Single process, whole batch: per step, every parameter's gradient (None if unused),
    and the final weights. The batch mean over the whole batch equals the mean over ranks of
    equal-sized shard means, so this is what every data-parallel version must reproduce."""
    torch.manual_seed(SEED)
    model = Net().to(DTYPE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads = []
    for step, (X, y) in enumerate(_batches()):
        opt.zero_grad()
        _step_loss(model, X, y, use_aux_fn(step)).backward()
        grads.append({n: None if p.grad is None else p.grad.clone()
                      for n, p in model.named_parameters()})
        opt.step()
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def _train_shard(rank, world_size, wrap, use_aux_fn, after_backward=None):
    """Train Net on this rank's shard, wrapped by ``wrap(model)``; per-step gradients as
    the optimiser sees them, and the final weights."""
    torch.manual_seed(SEED)
    model = Net().to(DTYPE)
    wrapped = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    shard = BATCH // world_size
    grads = []
    for step, (X, y) in enumerate(_batches()):
        X, y = X[rank * shard:(rank + 1) * shard], y[rank * shard:(rank + 1) * shard]
        opt.zero_grad()
        _step_loss(wrapped, X, y, use_aux_fn(step)).backward()
        if after_backward is not None:
            after_backward(wrapped)
        grads.append({n: None if p.grad is None else p.grad.clone()
                      for n, p in model.named_parameters()})
        opt.step()
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def _aux_on_even_steps(step):
    return step % 2 == 0


def _aux_never(step):
    return False


def _assert_grads_equal(got, expected, label, exact=False):
    for step, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.keys() == e.keys()
        for name in e:
            where = f"{label}, step {step}, {name}"
            if e[name] is None:
                assert g[name] is None, f"{where}: expected no gradient"
            else:
                assert g[name] is not None, f"{where}: gradient missing"
                if exact:
                    assert torch.equal(g[name], e[name]), f"{where}: not bitwise equal"
                else:
                    torch.testing.assert_close(g[name], e[name], msg=lambda m, w=where: f"{w}: {m}")


# ---- (a) the shared-memory all-reduce as BucketedDDP's comm hook --------------------------

def _bucketed_default_and_shm(rank, world_size):
    """Both in one launch: the default gloo hook, then the shm hook on a fresh model."""
    def default(model):
        return lu.ddp.BucketedDDP(model, bucket_cap_mb=0.02, find_unused_parameters=True)

    shm = lu.shm_allreduce.ShmAllReduce(chunk_bytes=4096)  # several chunks per big bucket
    hooked, hook_calls = [], []

    def counting_hook(state, bucket):   # counted from outside: BucketedDDP keeps no counts
        hook_calls.append(bucket.index())
        return lu.shm_allreduce.shm_allreduce_hook(state, bucket)

    def with_shm(model):
        ddp = lu.ddp.BucketedDDP(model, bucket_cap_mb=0.02, find_unused_parameters=True)
        ddp.register_comm_hook(shm, counting_hook)
        hooked.append(ddp)
        return ddp

    try:
        gloo = _train_shard(rank, world_size, default, _aux_on_even_steps)
        via_shm = _train_shard(rank, world_size, with_shm, _aux_on_even_steps)
    finally:
        shm.close()
    (ddp,) = hooked
    return gloo, via_shm, {"buckets": len(ddp.buckets), "allreduces": len(hook_calls),
                           "shm_chunks": shm.turn}


@pytest.mark.lab04c2
@pytest.mark.slow
def test_shm_hook_in_bucketed_ddp_equals_gloo_and_single_process():
    if not lu.shm_allreduce.supported():
        pytest.skip("shared-memory all-reduce needs x86's total store order; this CPU "
                    "has none (ShmAllReduce refuses to start)")
    ref_grads, ref_weights = _reference(_aux_on_even_steps)
    results = lu.launch(_bucketed_default_and_shm, world_size=2, timeout=120)
    for rank, ((gloo_grads, gloo_w), (shm_grads, shm_w), counts) in enumerate(results):
        # the hook was really used: one call per bucket with a gradient, several chunks each
        assert counts["buckets"] > 1 and counts["allreduces"] >= counts["buckets"], counts
        assert counts["shm_chunks"] > counts["allreduces"], counts
        _assert_grads_equal(shm_grads, ref_grads, f"shm hook, rank {rank}")
        _assert_grads_equal(gloo_grads, ref_grads, f"gloo hook, rank {rank}")
        # both sum the same 2 per-rank buckets and divide by 2: the same bits
        _assert_grads_equal(shm_grads, gloo_grads, f"shm vs gloo, rank {rank}", exact=True)
        torch.testing.assert_close(shm_w, ref_weights)
        for name, value in gloo_w.items():
            assert torch.equal(shm_w[name], value), f"shm vs gloo, rank {rank}, {name}"
    for name, value in results[0][1][1].items():  # replicas identical, bit for bit
        assert torch.equal(results[1][1][1][name], value), name


# ---- (b) HookedDDP with a parameter unused on every rank ----------------------------------

def _hooked_with_unused(rank, world_size):
    issued = []

    def wait(wrapped):
        issued.append(len(wrapped.pending))  # all-reduces started by this backward
        wrapped.wait()
        assert wrapped.pending == []

    result = _train_shard(rank, world_size, lu.ddp.HookedDDP, _aux_never, after_backward=wait)
    return result, issued


@pytest.mark.lab04a
@pytest.mark.slow
def test_hooked_ddp_parameter_unused_everywhere_keeps_no_grad():
    ref_grads, ref_weights = _reference(_aux_never)
    assert ref_grads[0]["aux.weight"] is None and ref_grads[0]["aux.bias"] is None
    n_params = len(list(Net().parameters()))
    # a timeout: were an all-reduce left unmatched on a peer, the launch fails, not hangs
    results = lu.launch(_hooked_with_unused, world_size=2, timeout=60)
    for rank, ((grads, weights), issued) in enumerate(results):
        # aux.weight and aux.bias got no gradient: no hook fired, no all-reduce for them
        assert issued == [n_params - 2] * STEPS, issued
        _assert_grads_equal(grads, ref_grads, f"HookedDDP, rank {rank}")
        torch.testing.assert_close(weights, ref_weights)
    # aux never moved: still its initial value on every rank
    torch.manual_seed(SEED)
    init = Net().to(DTYPE)
    for (_, weights), _ in results:
        assert torch.equal(weights["aux.weight"], init.aux.weight.detach())


def _every_backward(ddp_model, micro_batches, loss_fn):   # the same gradients, k all-reduce rounds
    for X, y in micro_batches:
        (loss_fn(ddp_model(X), y) / len(micro_batches)).backward()


@pytest.mark.lab04b
@pytest.mark.slow
def test_accumulation_cost_counts_one_gradient_of_bytes_with_no_sync_and_k_without():
    fns = {"no_sync": lu.ddp_hooks.accumulate_with_no_sync, "every backward": _every_backward}
    for r in lu.launch(lu.ddp_performance.accumulation_cost, fns, micro_batches=3, micro_batch=4,
                       hidden=16, rounds=2, world_size=2):
        assert r["bytes"]["no_sync"] == r["gradient bytes"] > 0
        assert r["bytes"]["every backward"] == 3 * r["gradient bytes"]
        assert r["calls"]["every backward"] == 3 * r["calls"]["no_sync"]
        assert all(len(r["seconds"][name]) == 2 for name in fns)


@pytest.mark.lab04b
def test_accumulation_cost_refuses_an_empty_set_of_variants():
    with pytest.raises(ValueError, match="accumulate_fns is empty"):
        lu.ddp_performance.accumulation_cost(0, 1, {})
