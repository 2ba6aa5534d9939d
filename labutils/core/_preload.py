"""Imported once by the launcher's forkserver, so each rank's fork starts warm."""
import os

import cloudpickle  # noqa: F401
import numpy  # noqa: F401
import torch  # noqa: F401

# Imported lazily by torch on first use (an optimiser's constructor pulls in torch._dynamo, a
# non-scalar backward pulls in sympy), which costs every rank seconds on every launch; here it
# is paid once. None of these start threads or touch CUDA.
import torch._dynamo  # noqa: F401
import torch.distributed  # noqa: F401
import torch.distributed.algorithms.ddp_comm_hooks  # noqa: F401
import torch.distributed.checkpoint  # noqa: F401
import torch.distributed.fsdp  # noqa: F401
import torch.distributed.pipelining  # noqa: F401
import torch.distributed.tensor  # noqa: F401 (DTensor; also pulled in by torch.testing)
import torch.distributed.tensor.parallel  # noqa: F401
import torch.fx.experimental.symbolic_shapes  # noqa: F401
import torch.nn  # noqa: F401
import torch.nn.parallel  # noqa: F401
import torch.optim  # noqa: F401
import torch.testing  # noqa: F401
import torch.utils.checkpoint  # noqa: F401

import labutils.core.launcher  # noqa: F401

# The course's modules used inside ranks, named by the face through ``core.forkserver.set_preload`` (from the course map); a broken
# one must not take the forkserver down: its own import reports it in the rank.
for _name in filter(None, os.environ.get("LABUTILS_PRELOAD", "").split(",")):
    try:
        __import__(_name)
    except Exception:  # noqa: BLE001
        pass
