"""docs/classrooms.md (issue 31: JupyterHub and hosted notebook services) says only what the
code does: the make targets and tools it names exist, the threads rule and the environment
variables are the launcher's, the install command uses the Makefile's torch index, the memory it
asks for is `make doctor`'s threshold. No process is started."""
import inspect
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "classrooms.md").read_text(encoding="utf-8")
MAKEFILE = (ROOT / "Makefile").read_text(encoding="utf-8")


def test_the_make_targets_it_names_exist():
    named = set(re.findall(r"(?:`|^\s+)make ([\w-]+)", PAGE, flags=re.M))
    assert {"doctor", "lab", "venv"} <= named
    targets = set(re.findall(r"^([\w-]+):", MAKEFILE, flags=re.M))
    assert named <= targets, named - targets


def test_the_threads_rule_is_the_launchers(monkeypatch):
    from labutils.core import launcher
    assert "threads_per_rank or default_threads(world_size)" in inspect.getsource(launcher.launch)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(launcher, "cpu_count", lambda: 8)
    assert [launcher.default_threads(n) for n in (1, 2, 3, 16)] == [8, 4, 2, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert launcher.default_threads(2) == 1
    assert "max(1, cores // world_size)" in PAGE and "`threads_per_rank`" in PAGE
    assert '"OMP_NUM_THREADS"' in inspect.getsource(launcher._env_threads)
    from labutils.core import env
    assert "sched_getaffinity" in inspect.getsource(env.cpu_count) and "sched_getaffinity" in PAGE


def test_the_environment_variables_it_names_are_the_codes():
    named = set(re.findall(r"\b(OMP_NUM_THREADS|GLOO_SOCKET_IFNAME|TMPDIR)\b", PAGE))
    assert named == {"OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME", "TMPDIR"}
    rank = (ROOT / "labutils" / "core" / "rank.py").read_text(encoding="utf-8")
    assert 'os.environ["GLOO_SOCKET_IFNAME"] = "lo"' in rank
    job = (ROOT / "labutils" / "core" / "job.py").read_text(encoding="utf-8")
    assert "tempfile.mkdtemp" in job and 'bind(("127.0.0.1", 0))' in job
    assert '{"OMP_NUM_THREADS": "1"}' in PAGE


def test_the_install_command_matches_the_makefile_and_requirements():
    index = re.search(r"^TORCH_CPU_INDEX := (\S+)", MAKEFILE, flags=re.M).group(1)
    assert f"pip install --extra-index-url {index} -r requirements.txt" in PAGE
    assert "pip install -e ." in PAGE
    pins = (ROOT / "requirements.txt").read_text(encoding="utf-8")
    assert "torch==2.13.0+cpu" in pins and "jupyterlab-rise==" in pins and "ipywidgets==" in pins


def test_the_memory_it_asks_for_is_the_doctors_threshold():
    from labutils.bench import doctor
    assert doctor.check_memory(4 * 2**30).status == "ok"
    assert doctor.check_memory(4 * 2**30 - 1).status == "warn"
    assert "at least 4 GiB" in PAGE and 'mem_limit = "4G"' in PAGE


def test_the_tools_and_files_it_names_exist():
    for path in re.findall(r"`(tools/[\w/.-]+|labutils/[\w/.-]+)`", PAGE):
        assert (ROOT / path).exists(), path
    copies = (ROOT / "tools" / "student_copies.py").read_text(encoding="utf-8")
    assert '"--dest"' in copies and '"--edition"' in copies and "def reset" in copies
    overrides = json.loads((ROOT / "tools" / "jupyterlab" / "overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
    assert "share/jupyter/lab/settings/overrides.json" in MAKEFILE
    from labutils.core import forkserver
    assert "forkserver" in inspect.getsource(forkserver)


def test_the_largest_world_size_it_states_is_the_labs():
    sizes = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        sizes[path.stem] = [int(n) for n in re.findall(r"world_size=(\d+)", text)]
    assert "up to 8 ranks (lab 06e" in PAGE
    assert max(sizes["06e_composed_parallelism"] or [8]) <= 8
