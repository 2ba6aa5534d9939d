"""Is this machine ready for the labs? ``python -m labutils.bench.doctor`` (``make doctor``).

For a teacher checking a room's machines before a workshop, in well under 30 s: Python, the
pinned torch, cores and memory, free disk, JupyterLab, a Chinese font (the labs' titles carry the
article's chapter names), the browser the UI test drives, and a real 2-rank all-reduce launched
the way every lab launches. Each line says ``[ok]``, ``[warn]`` (the labs run, something is
missing or small) or ``[fix]`` (a lab will fail) and, when not ok, what to do. Exit status 1 when
any line says ``[fix]``.
"""
from __future__ import annotations

import importlib.util
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from labutils.core.env import ROOT, cpu_count
from labutils.core.launcher import launch

PINNED_TORCH = "2.13.0"
CHROMIUM = "/usr/bin/chromium"


@dataclass(frozen=True)
class Finding:
    what: str
    status: str          # "ok", "warn" or "fix"
    detail: str
    fix: str = ""

    def line(self):
        tail = f"\n       -> {self.fix}" if self.fix and self.status != "ok" else ""
        return f"[{self.status}] {self.what}: {self.detail}{tail}"


def check_python(version=None):
    version = version or platform.python_version_tuple()
    ok = tuple(int(v) for v in version[:2]) >= (3, 10)
    return Finding("Python", "ok" if ok else "fix", ".".join(version),
                   "install Python 3.10 or newer, then `make clean && make lab`")


def check_torch(version=None):
    version = (version or torch.__version__).split("+")[0]
    return Finding("torch", "ok" if version == PINNED_TORCH else "fix", version,
                   f"torch {PINNED_TORCH} is pinned: `make clean && make lab` reinstalls it")


def check_cores(cores=None):
    cores = cores or cpu_count()
    if cores >= 2:
        return Finding("cores", "ok", f"{cores} logical CPUs this process may use")
    return Finding("cores", "warn", f"{cores} logical CPU",
                   "the labs run, but 2 ranks share one core: speedups cannot show; give the "
                   "machine (or the container, or each JupyterHub user) at least 2 cores")


def check_memory(total_bytes=None):
    gib = (total_bytes or psutil.virtual_memory().total) / 2**30
    if gib >= 4:
        return Finding("memory", "ok", f"{gib:.0f} GiB")
    return Finding("memory", "warn", f"{gib:.1f} GiB",
                   "4 GiB or more: a lab with 4 ranks holds 4 copies of torch")


def check_disk(path=ROOT, free_bytes=None):
    gib = (free_bytes if free_bytes is not None else shutil.disk_usage(path).free) / 2**30
    if gib >= 1:
        return Finding("free disk", "ok", f"{gib:.0f} GiB")
    return Finding("free disk", "warn", f"{gib:.1f} GiB", "free 1 GiB: checkpoints and traces")


def check_jupyterlab():
    have = {name: importlib.util.find_spec(name) is not None
            for name in ("jupyterlab", "ipywidgets", "jupyterlab_language_pack_zh_CN")}
    missing = [name for name, ok in have.items() if not ok]
    return Finding("JupyterLab", "fix" if missing else "ok",
                   f"missing {', '.join(missing)}" if missing else "JupyterLab, widgets, 中文 pack",
                   "run `make lab` (it installs requirements.txt into .venv)")


def check_font(fc_list_output=None):
    if fc_list_output is None:
        fc_list_output = ""
        if shutil.which("fc-list"):
            fc_list_output = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True,
                                            text=True, timeout=10).stdout
    families = sorted({line.split(",")[0].strip() for line in fc_list_output.splitlines() if line})
    if families:
        return Finding("Chinese font", "ok", families[0])
    return Finding("Chinese font", "warn", "none found (titles such as 结论与展望 draw as boxes)",
                   "Debian/Ubuntu: `sudo apt-get install fonts-wqy-microhei`; macOS and Windows "
                   "ship one")


def check_browser(chromium=CHROMIUM):
    has_playwright = importlib.util.find_spec("playwright") is not None
    if Path(chromium).exists() and has_playwright:
        return Finding("browser for the UI test", "ok", chromium)
    return Finding("browser for the UI test", "warn",
                   "no Chromium at " + chromium if has_playwright else "no Playwright",
                   "only `make test`/`make ui-test` need it and install it with apt-get "
                   "(`sudo apt-get install chromium`); the labs do not")


def _all_reduce(rank, world_size):
    import torch.distributed as dist
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()


def check_launch(world_size=2):
    start = time.perf_counter()
    try:
        got = launch(_all_reduce, world_size=world_size, timeout=60.0,
                     warn_oversubscription=False)
    except Exception as e:   # any failure is the finding: name it
        return Finding(f"{world_size}-rank launch", "fix", f"{type(e).__name__}: {e}",
                       "the labs cannot start ranks here: check that 127.0.0.1 is reachable "
                       "(no firewall on loopback) and that /dev/shm is writable")
    expected = world_size * (world_size + 1) / 2
    if got != [expected] * world_size:
        return Finding(f"{world_size}-rank launch", "fix", f"all-reduce gave {got}",
                       "gloo's all-reduce gives wrong sums: reinstall with `make clean && make lab`")
    return Finding(f"{world_size}-rank launch", "ok",
                   f"gloo all-reduce on {world_size} ranks in {time.perf_counter() - start:.1f} s "
                   "(a cold start; warm launches take about 0.1 s)")


def gpu_note():
    if not torch.cuda.is_available():
        return Finding("GPU", "ok", "none (the labs need none; `make gpu-check` on a GPU machine)")
    return Finding("GPU", "ok", f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")


def run():
    """Every finding, cheapest first; the launch last."""
    checks = (check_python, check_torch, check_cores, check_memory, check_disk,
              check_jupyterlab, check_font, check_browser, gpu_note, check_launch)
    return [check() for check in checks]


def main(argv=None):
    start = time.perf_counter()
    findings = run()
    for f in findings:
        print(f.line())
    fixes = sum(f.status == "fix" for f in findings)
    warns = sum(f.status == "warn" for f in findings)
    verdict = ("ready for the labs" if not fixes else f"{fixes} thing(s) to fix before a class")
    print(f"\n{verdict}; {warns} warning(s); checked in {time.perf_counter() - start:.1f} s")
    return 1 if fixes else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
