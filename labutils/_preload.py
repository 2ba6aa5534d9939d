"""Imported once by the launcher's forkserver, so each rank's fork starts warm."""
import cloudpickle  # noqa: F401
import numpy  # noqa: F401
import torch  # noqa: F401
import torch.distributed  # noqa: F401
import torch.nn  # noqa: F401

import labutils  # noqa: F401
import labutils.launcher  # noqa: F401
