"""What this machine has for distributed training, and which world sizes suit it.

``lu.env.report()`` is the first cell of ``01_introduction``; ``lu.env.describe()`` is the
one-line machine description printed beside every benchmark table.
"""
from __future__ import annotations

import contextlib
import os
import platform
from dataclasses import dataclass, field

import psutil

from labutils.core.i18n import tr

# The repository: notebooks/, data/ (the data that ships) and labutils/ below it.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class EnvReport:
    cores: int                # cores this process may use (affinity), what ranks share
    memory_gb: float
    gpus: tuple               # names of CUDA devices
    backends: dict            # backend name -> available?
    torch_version: str
    python_version: str
    system: str
    recommended_world_sizes: tuple = field(default=())

    def lines(self):
        gpus = ", ".join(self.gpus) if self.gpus else tr("none")
        # outside the f-string: Babel's extractor (tools/zh_messages.py) reads no call inside one
        yes, no = tr("yes"), tr("no")
        backends = ", ".join(f"{k} {yes if v else no}" for k, v in self.backends.items())
        sizes = ", ".join(map(str, self.recommended_world_sizes))
        per = (tr("one rank per core or GPU; more ranks share cores") if self.gpus else
               tr("one rank per core; more ranks share cores"))
        return [tr("logical CPUs this process may use (affinity mask): {cores}", cores=self.cores),
                tr("memory: {gb:.1f} GB", gb=self.memory_gb),
                tr("GPUs: {gpus}", gpus=gpus),
                tr("backends: {backends}", backends=backends),
                f"torch {self.torch_version}, Python {self.python_version}, {self.system}",
                tr("recommended world sizes: {sizes} ({per})", sizes=sizes, per=per)]

    def __str__(self):
        return "\n".join(self.lines())

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))


def cpu_count():
    """The cores this process may run on (its affinity mask), which a container or taskset can
    make fewer than the machine has."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def recommended_world_sizes(cores, gpus):
    """One rank per GPU, else one per core: powers of two up to that (and the count itself)."""
    limit = gpus if gpus else cores
    sizes = [1]
    while sizes[-1] * 2 <= limit:
        sizes.append(sizes[-1] * 2)
    if limit not in sizes:
        sizes.append(limit)
    return tuple(sizes)


def report():
    """Cores, memory, GPUs, available backends, versions and recommended world sizes."""
    import torch
    import torch.distributed as dist
    gpus = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) \
        if torch.cuda.is_available() else ()
    backends = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available() and bool(gpus),
                "mpi": dist.is_mpi_available()}
    cores = cpu_count()
    return EnvReport(cores=cores, memory_gb=psutil.virtual_memory().total / 1e9, gpus=gpus,
                     backends=backends, torch_version=torch.__version__.split("+")[0],
                     python_version=platform.python_version(),
                     system=f"{platform.system()} {platform.machine()}",
                     recommended_world_sizes=recommended_world_sizes(cores, len(gpus)))


def describe():
    """One line for benchmark tables: cores, memory, CPU model, GPUs, torch."""
    r = report()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpus = f", GPUs: {', '.join(r.gpus)}" if r.gpus else ", no GPU"
    return f"{r.cores} cores ({cpu}), {r.memory_gb:.0f} GB{gpus}, torch {r.torch_version}"


def machine():
    """A one-line description of this machine: CPU, cores, memory, OS, Python, torch."""
    import platform

    import torch
    cpu = platform.machine()  # platform.processor() would start a `uname` process
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    cores = cpu_count()
    try:
        import psutil
        mem = tr(", {gib} GiB RAM", gib=f"{psutil.virtual_memory().total / 2**30:.0f}")
    except ImportError:
        mem = ""
    gpu = (tr(", GPU {name}", name=torch.cuda.get_device_name(0))
           if torch.cuda.is_available() else tr(", no GPU"))
    return tr("{cpu}, {cores} cores{mem}{gpu}; {system} {release}, Python {python}, torch "
              "{torch}", cpu=cpu, cores=cores, mem=mem, gpu=gpu, system=platform.system(),
              release=platform.release(), python=platform.python_version(),
              torch=torch.__version__)


@contextlib.contextmanager
def one_thread():
    """Run tiny single-process loops on one thread: with several, each small op pays for
    waking the others, which on a busy 2-core machine can cost ten times the op itself."""
    import torch
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)
