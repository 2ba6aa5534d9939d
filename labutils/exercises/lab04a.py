"""Exercise checkers of lab 04a: average gradients (the worked example), synchronise the
gradients in one message, and PyTorch's bucket rule. Registered in ``labutils.course``;
notebooks call them as ``lu.check_<name>``."""
import torch

from labutils.core.i18n import tr
from labutils.exercises.base import (
    CheckResult,
    call_learner,
    make_cases,
    require_function,
    run_check,
)
from labutils.experiments.ddp_equivalence import (
    MixedNet,
    torch_bucket_names,
    train_data_parallel,
    train_reference,
)


def average_gradients(model, world_size):
    """Reference: replace every gradient with its mean over the ranks (in place)."""
    import torch.distributed as dist
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad /= world_size


def _tiny_model_grads(seed, rank, n):
    """The gradients rank ``rank`` computes on its own batch of ``n`` samples."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randn(n, 4, generator=generator)
    y = torch.randn(n, 2, generator=generator)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return model


def _average_gradients_harness(rank, world_size, learner_fn, seed, n):
    # Reference computed in this single process: every rank's batch is rebuilt here.
    grads = [dict(_tiny_model_grads(seed, r, n).named_parameters()) for r in range(world_size)]
    expected = {name: sum(g[name].grad for g in grads) / world_size for name in grads[0]}
    model = _tiny_model_grads(seed, rank, n)
    learner_fn(model, world_size)
    got = {name: (p.grad.clone() if p.grad is not None else None)
           for name, p in model.named_parameters()}
    return expected, got


def check_average_gradients(learner_fn, *, timeout=20.0):
    """Check ``learner_fn(model, world_size)``: after it, every ``.grad`` on every rank is the
    mean of that gradient over all ranks."""
    cases = make_cases(world_sizes=(2, 3, 4), per_world_size=1, seed=4, n=[3, 5, 8])
    return run_check("average_gradients", learner_fn, _average_gradients_harness, cases,
                     timeout=timeout)


def sync_gradients(model):
    """Reference: the mean gradient over the ranks with two all-reduces whatever the number of
    parameters: which parameters got a gradient on some rank, then every such gradient in one
    flat buffer (zeros where this rank has none)."""
    import torch.distributed as dist
    params = [p for p in model.parameters() if p.requires_grad]
    used = torch.tensor([float(p.grad is not None) for p in params])
    dist.all_reduce(used)
    live = [p for p, u in zip(params, used.tolist()) if u > 0]
    for p in live:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in live])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for p, part in zip(live, flat.split([p.numel() for p in live])):
        p.grad.copy_(part.view_as(p))




def _sizes_agreed(learner_fn):
    """``learner_fn`` with every ``dist.all_reduce`` it calls preceded by an all-gather of the
    tensor's size: ranks that all-reduce different sizes (the typical mistake: skipping the
    gradients that are None on this rank only) get a message instead of a hang."""
    import torch.distributed as dist

    def run(model):
        real = dist.all_reduce

        def agreed(tensor, *args, **kwargs):
            sizes = [None] * dist.get_world_size()
            dist.all_gather_object(sizes, tensor.numel())
            if len(set(sizes)) > 1:
                raise ValueError(tr("the ranks all-reduce tensors of different sizes ({sizes} "
                                    "numbers): a rank that skips the gradients it has not got "
                                    "(None) sends a shorter buffer; put zeros in their place",
                                    sizes=", ".join(map(str, sizes))))
            return real(tensor, *args, **kwargs)
        dist.all_reduce = agreed
        try:
            return learner_fn(model)
        finally:
            dist.all_reduce = real
    return run


def _sync_gradients_harness(rank, world_size, learner_fn, seed, aux_pattern, steps=3):
    # float64: the ranks sum in another order than one process; in float64 the difference
    # (~1e-16 relative) stays far inside the tolerance on every CPU, a wrong average does not
    expected = train_reference(steps=steps, batch_size=6 * world_size, seed=seed,
                               aux_pattern=aux_pattern, world_size=world_size,
                               dtype=torch.float64)
    got, counts = train_data_parallel(rank, world_size, "custom", steps=steps,
                                      batch_size=6 * world_size, seed=seed,
                                      aux_pattern=aux_pattern, sync=_sizes_agreed(learner_fn),
                                      dtype=torch.float64)
    weights = tr("weights")
    calls = tr("all-reduce calls: at most 2 per step (usage flags, then one flat buffer)")
    return ({weights: expected, calls: True},
            {weights: got, calls: counts["allreduces"] <= 2 * steps})


def check_sync_gradients(learner_fn, *, timeout=60.0):
    """Check ``learner_fn(model)``, called after ``backward()`` on every rank: three SGD steps
    must give the weights of single-process training on the whole batch, including steps where
    the ``aux`` branch is unused on every rank or on some ranks only, with at most two
    all-reduce calls per step (counted), however many parameters the model has."""
    cases = make_cases(world_sizes=(2, 3), per_world_size=1, seed=4, aux_pattern=["even"])
    cases += make_cases(world_sizes=(2,), per_world_size=1, seed=5, aux_pattern=["rank0"])
    return run_check("sync_gradients", learner_fn, _sync_gradients_harness, cases,
                     timeout=timeout)


def _assign(params, bucket_cap_mb, *, reach=True, per_dtype=True, split_dtypes=True,
            reverse=True):
    """Greedy bucket assignment; the defaults are PyTorch's rule, each flag off one typical
    mistake: ``reach`` (close once the bucket has reached the cap, not before a parameter would
    pass it), ``per_dtype`` (one open bucket per dtype), ``split_dtypes`` (a bucket holds one
    dtype), ``reverse`` (reverse registration order: the order backward produces gradients)."""
    cap = int(bucket_cap_mb * 2**20)
    order = list(reversed(list(params))) if reverse else list(params)
    done, open_ = [], {}
    for p in order:
        key = (p.dtype if per_dtype else "open") if split_dtypes else "all"
        if split_dtypes and not per_dtype and open_ and open_["open"][0].dtype != p.dtype:
            done.append(open_.pop("open"))          # another dtype closes the open bucket
        bucket = open_.setdefault(key, [])
        size = sum(q.numel() * q.element_size() for q in bucket)
        if not reach and bucket and size + p.numel() * p.element_size() > cap:
            done.append(open_.pop(key))
            bucket = open_.setdefault(key, [])
        bucket.append(p)
        if reach and size + p.numel() * p.element_size() >= cap:
            done.append(open_.pop(key))
    first = {id(p): i for i, p in enumerate(order)}
    return sorted(done + list(open_.values()), key=lambda b: first[id(b[0])])


def torch_buckets(params, bucket_cap_mb):
    """Reference: what PyTorch's bucketing function (``_compute_bucket_assignment_by_size``, the
    one DDP calls) returns for parameters in reverse registration order. Add each parameter to
    the open bucket of its dtype (one open bucket per dtype, so a parameter of another dtype
    does not close it), and close that bucket once it has reached ``bucket_cap_mb`` MiB, so a
    bucket may end above the cap. Buckets are listed in the order of their first parameter
    (DDP itself reorders them by gradient arrival after its first step)."""
    cap = int(bucket_cap_mb * 2**20)
    order = list(reversed(list(params)))
    done, open_ = [], {}              # dtype -> the bucket still filling
    for p in order:
        bucket = open_.setdefault(p.dtype, [])
        bucket.append(p)
        if sum(q.numel() * q.element_size() for q in bucket) >= cap:
            done.append(open_.pop(p.dtype))
    first = {id(p): i for i, p in enumerate(order)}
    return sorted(done + list(open_.values()), key=lambda b: first[id(b[0])])


# (hidden, head dtype, bucket_cap_mb): float32 first, then a float64 head
_BUCKET_CASES = ((32, None, 0.07), (16, None, 0.001), (64, None, 0.02), (32, None, 25.0),
                 (32, torch.float64, 0.02), (32, torch.float64, 0.001), (16, torch.float64, 0.004))


def _bucket_mistakes():
    return (
        (dict(reach=False), tr("that is section 3's rule (close a bucket before a parameter "
                               "would take it over the cap); PyTorch adds the parameter first "
                               "and closes the bucket once it has reached the cap")),
        (dict(reverse=False), tr("the buckets follow registration order; PyTorch fills them in "
                                 "reverse, the order backward produces the gradients")),
        (dict(split_dtypes=False), tr("a bucket mixes dtypes (head is float64 here); one flat "
                                      "buffer holds one dtype")),
        (dict(per_dtype=False), tr("a parameter of another dtype closed the open bucket; "
                                   "PyTorch keeps one open bucket per dtype, so the float32 "
                                   "parameters after head go on filling theirs")),
    )


def check_torch_buckets(learner_fn):
    """Check ``learner_fn(params, bucket_cap_mb) -> list of lists of parameters`` against what
    PyTorch's bucketing function returns for reverse-order parameters, on float32 models and
    on models whose head is float64. No processes: the rule is local."""
    require_function("torch_buckets", learner_fn)
    for number, (hidden, head_dtype, cap) in enumerate(_BUCKET_CASES, 1):
        where = tr("[wrong] {name}: case {number} of {total} ({case})", name="torch_buckets",
                   number=number, total=len(_BUCKET_CASES),
                   case=f"MixedNet(hidden={hidden}, head_dtype={head_dtype}), "
                        f"bucket_cap_mb={cap}")
        model = MixedNet(hidden=hidden, head_dtype=head_dtype)
        names = {id(p): n for n, p in model.named_parameters()}
        expected = torch_bucket_names(model, cap)   # PyTorch's own assignment
        got, failed = call_learner("torch_buckets", learner_fn, where, list(model.parameters()), cap)
        if failed:
            return failed
        try:
            got = [[names.get(id(p), "?") for p in b] for b in got]
        except TypeError:
            return CheckResult(False, tr("{where}: expected a list of lists of parameters",
                                         where=where))
        if got == expected:
            continue
        params = list(model.parameters())
        why = next((text for flags, text in _bucket_mistakes()
                    if got == [[names[id(p)] for p in b] for b in _assign(params, cap, **flags)]),
                   None)
        if why is None:
            b = next((i for i, (e, g) in enumerate(zip(expected, got)) if e != g),
                     min(len(expected), len(got)))
            why = tr("bucket {index} differs: PyTorch puts {expected} there, you put {got}",
                     index=b, expected=expected[b] if b < len(expected) else "nothing",
                     got=got[b] if b < len(got) else "nothing")
        return CheckResult(False, f"{where}: {why}")
    return CheckResult(True, tr("[ok] {name}: {total} cases passed", name="torch_buckets",
                                total=len(_BUCKET_CASES)))
