"""Run a lab's worker function under torchrun: the same ``fn(rank, world_size, ...)`` that
``lu.launch`` starts from a notebook, now on several processes, GPUs or nodes.

    torchrun --standalone --nproc-per-node=2 -m labutils.core.run labutils.bench.launch:_one_allreduce
    torchrun --nnodes=2 --node-rank=0 --nproc-per-node=1 --rdzv-backend=c10d \\
        --rdzv-endpoint=HOST:29400 -m labutils.core.run --save-result result.pt \\
        labutils.data.train:train_worker --steps 20

``--save-result FILE`` (before the function) makes rank 0 save the function's return value
with ``torch.save``. Arguments after the function are keyword arguments, ``--key value`` (``--some-key`` becomes
``some_key``); values are read as Python literals when they parse as one (``3``, ``0.1``,
``[1, 2]``, ``True``), as strings otherwise. A bare ``--flag`` means ``True``.
Used by 02 (the launchers map) and 04b (torchrun and fault tolerance).
"""
from __future__ import annotations

import ast
import importlib
import os
import sys

USAGE = ("usage: python -m labutils.core.run [--save-result FILE] package.module:function "
         "[--key value ...]")


def parse_target(spec):
    """'package.module:function' -> the function, with an error that says what to write."""
    if ":" not in spec:
        raise SystemExit(f"{USAGE}\nerror: {spec!r} has no ':function' part "
                         f"(e.g. labutils.bench.launch:_one_allreduce)")
    module_name, func_name = spec.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise SystemExit(f"error: cannot import module {module_name!r}: {e}") from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise SystemExit(f"error: {module_name} has no function {func_name!r}")
    return fn


def parse_kwargs(argv):
    """['--steps', '3', '--name', 'x', '--verbose'] -> {'steps': 3, 'name': 'x', 'verbose': True}"""
    kwargs, i = {}, 0
    while i < len(argv):
        key = argv[i]
        if not key.startswith("--") or len(key) == 2:
            raise SystemExit(f"{USAGE}\nerror: expected --key, got {key!r}")
        name = key[2:].replace("-", "_")
        if "=" in name:
            name, value = name.split("=", 1)
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, i = argv[i + 1], i + 2
        else:
            value, i = "True", i + 1
        try:
            kwargs[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[name] = value
    return kwargs


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    save_to = None
    if argv[0] == "--save-result" or argv[0].startswith("--save-result="):
        if "=" in argv[0]:
            save_to, argv = argv[0].split("=", 1)[1], argv[1:]
        elif len(argv) >= 2:
            save_to, argv = argv[1], argv[2:]
        if not save_to or not argv:
            raise SystemExit(f"{USAGE}\nerror: --save-result needs a file name, then the "
                             f"function")
    fn = parse_target(argv[0])
    kwargs = parse_kwargs(argv[1:])
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if k not in os.environ]
    if missing:
        raise SystemExit(f"error: {', '.join(missing)} not set: start this under torchrun, e.g.\n"
                         f"  torchrun --standalone --nproc-per-node=2 -m labutils.core.run {argv[0]}")
    import torch
    import torch.distributed as dist
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    backend = os.environ.get("LU_BACKEND") or (
        "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > local_rank else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    # Rendezvous through torchrun's store, under a prefix per restart attempt: after
    # `--max-restarts` torch reuses the agent's store, and without the prefix the new workers
    # can read the dead workers' addresses ("Gloo connectFullMesh failed").
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=(rank == 0 and not agent_store))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend, store=dist.PrefixStore(f"lu/attempt_{attempt}", store),
                            rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, **kwargs)
        if rank == 0 and save_to is not None:
            torch.save(result, save_to)
        if rank == 0 and result is not None:
            print(f"[rank 0] result: {result!r}", flush=True)
        # leave together: a rank that tears gloo down while a peer still works (rank 0 saving
        # the result) closes connections under it, and gloo's threads abort that process
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without running C++ static destructors: a gloo thread still winding down there can
    # abort a finished run ("terminate called without an active exception", SIGABRT; seen once
    # in a two-node test). Everything the run wrote is saved and closed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
