"""Exercise checkers of lab 06d3 (expert parallelism): which slots an expert keeps within its
capacity (first choices before second choices), and which rank each slot is sent to. Registered in
``labutils.course``; notebooks call them as ``lu.check_<name>``. Each wrong answer that a student
typically writes is recognised and named in whole sentences; every sentence goes through ``tr``
(its Chinese: ``exercises/locale/zh.po``)."""
import random

import torch

from labutils.core.errors import WorkerError
from labutils.core.i18n import tr
from labutils.core.launcher import launch
from labutils.exercises.base import (
    CheckResult,
    call_learner,
    first_difference,
    not_implemented,
    require_function,
)
from labutils.parallel.moe_router import dispatch_indices, keep_within_capacity  # noqa: F401

# ---- keep_within_capacity ------------------------------------------------------------------

_KEEP_CASES = (   # (tokens, experts, top_k, capacity, seed, skew): skew sends more tokens to expert 0
    (8, 4, 2, 3, 31, True),
    (10, 4, 2, 4, 32, True),
    (7, 3, 1, 2, 33, True),
    (12, 6, 2, 3, 34, False),
)


def _keep_decisions(tokens, num_experts, top_k, seed, skew):
    """A router's choices ``[T, k]``: distinct experts per token; with ``skew``, expert 0 is every
    other token's first choice and often a second choice, so capacity binds and the order shows."""
    rng = random.Random(seed)
    rows = []
    for t in range(tokens):
        first = 0 if skew and t % 2 == 0 else rng.randrange(num_experts)
        rest = [e for e in range(num_experts) if e != first]
        rng.shuffle(rest)
        if skew and top_k > 1 and first != 0 and 0 in rest and rng.random() < 0.7:
            rest.remove(0)
            rest.insert(0, 0)
        rows.append([first, *rest[:top_k - 1]])
    return torch.tensor(rows, dtype=torch.long)


def _keep_mistakes(expert, num_experts, cap):
    """Typical wrong answers: (their keep mask, what is wrong, in whole sentences)."""
    position_order = keep_within_capacity(expert, num_experts, cap + 1, first_choices_first=True)
    flat_first = torch.zeros(expert.numel(), dtype=torch.bool)
    flat_first[:cap] = True
    return (
        (keep_within_capacity(expert, num_experts, cap, first_choices_first=False),
         tr("An earlier token's second choice took the place of a later token's first choice: "
            "that is the token-major order t*k + j. Give every token's first choice its place "
            "before any second choice (go through the choices column by column).")),
        (keep_within_capacity(expert.flip(1), num_experts, cap).flip(1),
         tr("Second choices were placed before first choices. Place all first choices (column "
            "0) first, then the second choices.")),
        (position_order,
         tr("An expert kept one slot more than its capacity. Positions in an expert's buffer "
            "start at 0, so keep a slot while its position is below the capacity (<, not <=).")),
        (flat_first.view_as(expert),
         tr("Only the first capacity slots of all experts together were kept. The capacity "
            "applies to each expert separately: count the slots of each expert apart.")),
    )


def check_keep_within_capacity(learner_fn):
    """Check ``learner_fn(expert, num_experts, capacity) -> keep``: a ``[T, k]`` bool tensor,
    True for the slots each expert accepts in priority order (every first choice before any
    second choice, tokens in order within a choice). Process-free."""
    require_function("keep_within_capacity", learner_fn)
    total = len(_KEEP_CASES)
    for number, (tokens, num_experts, top_k, cap, seed, skew) in enumerate(_KEEP_CASES, 1):
        expert = _keep_decisions(tokens, num_experts, top_k, seed, skew)
        where = tr("[wrong] {name}: case {number} of {total} (T={tokens}, E={experts}, k={k}, "
                   "capacity {cap})", name="keep_within_capacity", number=number, total=total,
                   tokens=tokens, experts=num_experts, k=top_k, cap=cap)
        got, failed = call_learner("keep_within_capacity", learner_fn, where, expert.clone(),
                                   num_experts, cap)
        if failed:
            return failed
        want = keep_within_capacity(expert, num_experts, cap)
        if not isinstance(got, torch.Tensor):
            return CheckResult(False, tr("{where}: return a bool tensor shaped like expert "
                                         "({shape}); got {type}.", where=where,
                                         shape=list(expert.shape), type=type(got).__name__))
        if list(got.shape) == list(expert.shape)[::-1] and top_k > 1:
            return CheckResult(False, tr("{where}: the mask has shape {got}: it is transposed. "
                                         "Return it in the shape of expert, {shape} (token, "
                                         "choice).", where=where, got=list(got.shape),
                                         shape=list(expert.shape)))
        if list(got.shape) != list(expert.shape):
            return CheckResult(False, tr("{where}: the mask has shape {got}; it must have the "
                                         "shape of expert, {shape}.", where=where,
                                         got=list(got.shape), shape=list(expert.shape)))
        got = got.bool()
        if torch.equal(got, want):
            continue
        why = next((text for mask, text in _keep_mistakes(expert, num_experts, cap)
                    if torch.equal(got, mask)), None)
        if why is None:
            t, j = (int(i) for i in (got != want).nonzero()[0])
            why = tr("Token {t}'s choice {j} (expert {e}) should be {want}, got {got}.",
                     t=t, j=j, e=int(expert[t, j]), want=bool(want[t, j]), got=bool(got[t, j]))
        return CheckResult(False, tr("{where}: {why}", where=where, why=why),
                           {"case": number})
    return CheckResult(True, tr("[ok] {name}: {total} cases passed, every first choice placed "
                                "before any second choice", name="keep_within_capacity",
                                total=total))


# ---- dispatch_indices ----------------------------------------------------------------------

_DISPATCH_CASES = (   # E/N >= 2 in every case, so per expert and per rank, // and % all differ
    {"world_size": 2, "num_experts": 4, "tokens": 9, "top_k": 2, "seed": 11},
    {"world_size": 3, "num_experts": 6, "tokens": 7, "top_k": 2, "seed": 12},
    {"world_size": 4, "num_experts": 8, "tokens": 10, "top_k": 2, "seed": 13},
    {"world_size": 2, "num_experts": 8, "tokens": 6, "top_k": 1, "seed": 14},
    # the last rank's experts get no slot: a bincount without minlength returns N-1 counts
    {"world_size": 3, "num_experts": 6, "tokens": 5, "top_k": 2, "seed": 15, "empty_rank": 2},
)


def _decisions(seed, rank, tokens, num_experts, top_k, empty_rank=None, world_size=1):
    """A router's choices for one rank: ``[tokens, top_k]`` distinct experts per token, none of
    them an expert of ``empty_rank`` when it is given."""
    rng = random.Random(seed * 101 + rank)
    per_rank = num_experts // world_size
    experts = [e for e in range(num_experts) if empty_rank is None or e // per_rank != empty_rank]
    rows = [rng.sample(experts, top_k) for _ in range(tokens)]
    return torch.tensor(rows, dtype=torch.long)


def _as_long(x):
    try:
        t = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError):
        return None
    return t.long() if t.dim() == 1 and not t.is_floating_point() else None


def _dispatch_problem(expert, num_experts, world_size, order, counts):
    """What is wrong with ``(order, send_counts)``, in whole sentences, or None."""
    flat = expert.flatten()
    slots, per_rank, tokens = flat.numel(), num_experts // world_size, expert.shape[0]
    if counts is None or order is None:
        return tr("Return two 1-D integer tensors (or lists): order and send_counts.")
    if len(counts) < world_size:
        return tr("send_counts has {n} entries but there are {world_size} ranks: a rank whose "
                  "experts got no slot still needs its 0 (torch.bincount(..., minlength=N)).",
                  n=len(counts), world_size=world_size)
    if len(counts) == num_experts and num_experts != world_size:
        return tr("send_counts has one entry per expert ({num_experts}); all_to_all_single "
                  "needs one per rank ({world_size}): add up the counts of each rank's experts.",
                  num_experts=num_experts, world_size=world_size)
    if len(order) == tokens < slots or int(counts.sum()) == tokens < slots:
        return tr("Only {tokens} of the {slots} slots are sent: each token has k choices, so "
                  "flatten the [T, k] choices into T*k slots.", tokens=tokens, slots=slots)
    if len(counts) == world_size and counts.tolist() == torch.bincount(
            flat % world_size, minlength=world_size).tolist() != torch.bincount(
            flat // per_rank, minlength=world_size).tolist():
        return tr("Experts were dealt to ranks round robin (e % {world_size}); here they are "
                  "contiguous, so expert e lives on rank e // {per_rank}.",
                  world_size=world_size, per_rank=per_rank)
    if sorted(order.tolist()) != list(range(slots)):
        return tr("order must list each of the {slots} slots exactly once.", slots=slots)
    got = flat[order]
    if (got // per_rank).diff().lt(0).any():
        return tr("The slots are not grouped by destination rank (rank 0 first): "
                  "all_to_all_single sends consecutive blocks, one per rank.")
    if got.diff().lt(0).any():
        return tr("Within a rank the slots are not ordered by expert: the receiver cuts each "
                  "block into its experts' runs by the counts alone, so an expert would get "
                  "another expert's tokens.")
    if (order.diff()[got.diff() == 0] < 0).any():
        return tr("Within an expert the slots are not in slot order t*k + j: use a stable sort, "
                  "so the order is the same on every rank and in the reference.")
    return None


def _dispatch_harness(rank, world_size, learner_fn, seed, num_experts, tokens, top_k,
                      empty_rank=None):
    """Runs on every rank: this rank's decisions and the learner's answer for them."""
    expert = _decisions(seed, rank, tokens, num_experts, top_k, empty_rank, world_size)
    return expert, learner_fn(expert.clone(), num_experts, world_size)


def check_dispatch_indices(learner_fn, *, timeout=30.0):
    """Check ``learner_fn(expert, num_experts, world_size) -> (order, send_counts)`` on real
    ranks: each rank gets its own router decisions (``expert``, ``[T, k]``) and N is the launch's
    world size. The order the reference accepts: slots ``t*k + j`` sorted by expert, ties in slot
    order (stable), which groups them by destination rank; ``send_counts[r]``: slots for rank r."""
    require_function("dispatch_indices", learner_fn)
    first = dict(_DISPATCH_CASES[0])
    _, failed = call_learner("dispatch_indices", learner_fn, "dispatch_indices",
                             _decisions(first["seed"], 0, first["tokens"], first["num_experts"],
                                        first["top_k"], world_size=first["world_size"]),
                             first["num_experts"], first["world_size"])
    if failed:                     # not implemented yet, or it raises: no process needed to say so
        return failed
    total = len(_DISPATCH_CASES)
    for number, case in enumerate(_DISPATCH_CASES, 1):
        kwargs = {k: v for k, v in case.items() if k != "world_size"}
        world_size = case["world_size"]
        where = tr("[wrong] {name}: case {number} of {total} (N={world_size}, E={experts}, "
                   "k={k})", name="dispatch_indices", number=number, total=total,
                   world_size=world_size, experts=case["num_experts"], k=case["top_k"])
        try:
            answers = launch(_dispatch_harness, learner_fn, world_size=world_size,
                             timeout=timeout, threads_per_rank=1, warn_oversubscription=False,
                             **kwargs)
        except WorkerError as e:
            return CheckResult(False, tr("{where}: {error}", where=where, error=e), case)
        for rank, (expert, answer) in enumerate(answers):
            if not (isinstance(answer, (tuple, list)) and len(answer) == 2):
                problem = tr("Return a pair (order, send_counts); got {type}.",
                             type=type(answer).__name__)
            else:
                order, counts = (_as_long(a) for a in answer)
                problem = _dispatch_problem(expert, case["num_experts"], world_size, order,
                                            counts)
                if problem is None:
                    want = dispatch_indices(expert, case["num_experts"], world_size)
                    diff = first_difference({"order": want[0], "send_counts": want[1]},
                                            {"order": order, "send_counts": counts},
                                            atol=0, rtol=0)
                    problem = None if diff is None else diff
            if problem is not None:
                return CheckResult(False, tr("{where}: rank {rank}: {problem}", where=where,
                                             rank=rank, problem=problem), case)
    return CheckResult(True, tr("[ok] {name}: {total} cases passed (world sizes 2, 3, 4)",
                                name="dispatch_indices", total=total))
