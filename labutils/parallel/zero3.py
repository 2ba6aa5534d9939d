"""ZeRO stage 3 (P_os+g+p) for any module, from scratch on module hooks: the general, tested
version of the lesson's ``sharding.Zero3`` (``06c2_fsdp_and_memory``).

    model = Zero3Module(CharGPT(65), unit={Block, nn.Embedding, nn.Linear})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)   # the fp32 master shards
    model(x) ... loss.backward(); opt.step()

The model is cut into *units*: each outermost submodule matching ``unit`` (a predicate
``fn(name, module) -> bool``, or a set of module types), and the root for every parameter left
over. A parameter used by two units (a tied embedding and head) belongs to the root, their
common ancestor, as in FSDP2. Each unit keeps one flat fp32 *shard*: its parameters flattened,
concatenated, zero-padded to a multiple of world_size, and cut into world_size equal slices.

* forward: a pre-hook all-gathers the unit's shards into one full flat tensor whose slices
  become the module's weights; the forward hook frees that storage when the unit returns.
* backward: a hook on the unit's outputs fires when their gradient is ready, just before the
  unit's own backward runs, and all-gathers the weights again into the same storage (the
  tensors autograd saved are views of it). When the full gradient has accumulated (a
  post-accumulate-grad hook on the flat tensor), it is reduce-scattered (mean over ranks)
  into the shard's ``.grad`` and both the gradient and the weights are freed.

So a rank holds its shards, the root's full weights and, during forward, one other unit's;
during backward at most two others (the next unit may be gathered before the previous one's
gradient is reduced; on torch 2.13's CPU engine it was never more than one).

``compute_dtype`` (e.g. bfloat16) casts each shard before the all-gather (half the bytes) and
the unit's floating inputs, keeps fp32 master shards and reduces gradients in fp32: FSDP2's
``MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)``, which it
matches bit for bit in ``tests/test_zero3.py``. Tested with each unit called once per forward.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils._pytree import (  # private, but what FSDP2 walks args with
    tree_flatten,
    tree_map,
)

from labutils.parallel.zero_optimizer import (
    all_gather_into,
    padded,
    reduce_scatter_mean,
)


def _storage_bytes(t):
    return t.untyped_storage().nbytes()


class Unit:
    """A module whose parameters live as one flat shard: ``shard`` (the fp32 master, an
    ``nn.Parameter``), ``full`` (the gathered flat tensor, storage empty while freed), and
    ``refs``: every (owner module, attribute, index into ``shapes``) that uses them."""

    def __init__(self, module, params, refs, rank, world_size, compute_dtype):
        self.module, self.refs = module, refs
        self.shapes = [p.shape for p in params]
        self.offsets = torch.tensor([0] + [p.numel() for p in params]).cumsum(0).tolist()
        device = params[0].device
        # master shards in at least fp32 (a float64 model stays float64, as in the tests)
        master = torch.promote_types(params[0].dtype, torch.float32)
        flat = torch.zeros(padded(self.offsets[-1], world_size), dtype=master, device=device)
        torch.cat([p.detach().reshape(-1).to(master) for p in params], out=flat[:self.offsets[-1]])
        self.shard = nn.Parameter(flat.chunk(world_size)[rank].clone())
        self.full = torch.empty(flat.numel(), dtype=compute_dtype or master,
                                device=device, requires_grad=True)
        self.full.untyped_storage().resize_(0)  # freed until a forward needs it

    def views(self, flat):
        return [flat[a:b].view(s) for a, b, s in zip(self.offsets, self.offsets[1:], self.shapes)]

    def is_gathered(self):
        return _storage_bytes(self.full) > 0


def _unit_test(unit):
    if callable(unit) and not isinstance(unit, type):
        return unit
    types = tuple(unit) if isinstance(unit, (set, frozenset, list, tuple)) else (unit,)
    return lambda name, module: isinstance(module, types)


class Zero3Module(nn.Module):
    """``module`` with every parameter sharded over ``group`` (``None``: the whole world).

    ``unit``: which submodules gather and free their parameters together (see the module
    docstring); ``None``: the whole model is one unit (all weights gathered at once).
    ``compute_dtype``: dtype of the gathered weights (``None``: fp32). Collectives are
    counted from outside (``core.commcount.count_collectives``).
    ``parameters()`` are this rank's fp32 master shards, one per unit: give them to any
    optimizer (and to ``zero_optimizer.clip_grad_norm_``); ``state_dict()`` holds them, per
    rank. The wrapped module keeps no ``nn.Parameter``: its weights become plain attributes,
    set to slices of the gathered tensor by each forward. ``full_parameters()`` gathers the
    full fp32 weights by their original names; ``units`` (``Unit``: ``module``, ``names``,
    ``shard``, ``full``) and ``gathered_bytes()`` show what is sharded and what is alive.
    """

    def __init__(self, module, group=None, unit=None, compute_dtype=None):
        super().__init__()
        self.group, self.compute_dtype = group, compute_dtype
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
        self.module = module
        self.names = {id(p): n for n, p in module.named_parameters()}  # first name if tied
        is_unit = _unit_test(unit) if unit is not None else (lambda name, m: False)
        owner_unit = {"": ""}  # module name -> name of the unit that contains it
        for name, m in module.named_modules(remove_duplicate=False):
            if name:
                parent = owner_unit[name.rpartition(".")[0]]
                owner_unit[name] = name if parent == "" and is_unit(name, m) else parent
        refs = []  # (unit name, owner module, attribute, parameter), tied ones repeated
        for name, m in module.named_modules(remove_duplicate=False):
            refs += [(owner_unit[name], m, attr, p) for attr, p in m._parameters.items()
                     if p is not None]
        units_of = {}
        for unit_name, _, _, p in refs:
            units_of.setdefault(id(p), set()).add(unit_name)
        home = {pid: names.pop() if len(names) == 1 else "" for pid, names in units_of.items()}
        self.units = []
        modules = dict(module.named_modules())
        for unit_name in [n for n in modules if n and owner_unit[n] == n] + [""]:
            params = list({id(p): p for _, _, _, p in refs if home[id(p)] == unit_name}.values())
            if not params:
                continue  # e.g. an embedding whose only weight is tied to the head
            index = {id(p): i for i, p in enumerate(params)}
            unit_refs = [(m, attr, index[id(p)]) for _, m, attr, p in refs if id(p) in index]
            u = Unit(modules[unit_name], params, unit_refs, rank, world_size, compute_dtype)
            u.names = [self.names[id(p)] for p in params]
            self.units.append(u)
        for _, m, attr, _ in refs:
            m._parameters.pop(attr, None)  # from now on a plain attribute, set by each gather
        self.shards = nn.ParameterList([u.shard for u in self.units])
        for u in self.units:
            u.module.register_forward_pre_hook(
                lambda m, args, kwargs, u=u: self._pre_forward(u, args, kwargs),
                with_kwargs=True)
            u.module.register_forward_hook(lambda m, args, out, u=u: self._post_forward(u, out))
            u.full.register_post_accumulate_grad_hook(lambda full, u=u: self._reduce(u))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # ---- the hooks --------------------------------------------------------------------

    def _gather(self, u):
        if u.is_gathered():  # a tied or reused unit: already here
            return
        u.full.untyped_storage().resize_(u.full.numel() * u.full.element_size())
        # write through .data: autograd must not see (and version-check) this refill
        all_gather_into(u.full.data, u.shard.detach().to(u.full.dtype), self.group)

    def _pre_forward(self, u, args, kwargs):
        self._gather(u)
        views = u.views(u.full)  # slices of ``full``: their gradients accumulate into it
        for m, attr, i in u.refs:
            object.__setattr__(m, attr, views[i])
        if self.compute_dtype is None:
            return None
        def cast(t):
            return t.to(self.compute_dtype) if torch.is_tensor(t) and t.is_floating_point() else t
        return tree_map(cast, args), tree_map(cast, kwargs)

    def _post_forward(self, u, out):
        tensors = [t for t in tree_flatten(out)[0] if torch.is_tensor(t) and t.requires_grad]
        for t in tensors:  # fires before this unit's backward: bring the weights back
            t.register_hook(lambda grad, u=u: self._gather(u))
        self._free(u)

    def _reduce(self, u):
        grad = reduce_scatter_mean(u.full.grad.to(u.shard.dtype), self.group)  # in master dtype
        u.shard.grad = grad if u.shard.grad is None else u.shard.grad.add_(grad)
        u.full.grad = None
        self._free(u)

    def _free(self, u):
        u.full.untyped_storage().resize_(0)

    # ---- for tests and lessons ----------------------------------------------------------

    def gathered_bytes(self):
        """Bytes of full (unsharded) weights this rank holds right now."""
        return sum(_storage_bytes(u.full) for u in self.units)

    @torch.no_grad()
    def full_parameters(self):
        """{original name: full master-dtype weight}, gathered on every rank (a collective)."""
        out = {}
        for u in self.units:
            flat = u.shard.new_empty(u.full.numel())
            all_gather_into(flat, u.shard, self.group)
            out.update({n: v.clone() for n, v in zip(u.names, u.views(flat))})
        return out
