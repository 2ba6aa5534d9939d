"""The package's architecture (ARCHITECTURE.md), beyond what import-linter checks in `make test`:
one short name per module, no labutils import hidden in a function, headless algorithms, and
one registry (the course map) that names every checker and benchmark that exists."""
import ast
import importlib
import os

import pytest

import labutils as lu
from labutils import course

PACKAGE = os.path.dirname(lu.__file__)


def _modules():
    for layer in course.LAYERS:
        folder = os.path.join(PACKAGE, layer)
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                yield layer, name[:-3], os.path.join(folder, name)


def test_every_short_name_is_one_module():
    clashes = {name: paths for name, paths in course._FOUND.items() if len(paths) > 1}
    assert not clashes, f"two modules share a short name (lu.<name> would be ambiguous): {clashes}"
    for name, path in course.MODULES.items():
        assert getattr(lu, name) is importlib.import_module(path)
    assert set(course.MODULES) <= set(dir(lu))


def test_no_labutils_import_inside_a_function():
    """Every import of a labutils module is at the top of its file, where import-linter and a
    reader see it; one inside a function is how cycles used to hide."""
    hidden = []
    for layer, name, path in _modules():
        tree = ast.parse(open(path).read())
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
                names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                         else [a.name for a in node.names])
                if any(n == "labutils" or n.startswith("labutils.") for n in names):
                    hidden.append(f"{layer}/{name}.py:{node.lineno}")
    assert not hidden, f"labutils imported inside a function: {hidden}"


@pytest.mark.parametrize("layer", ["core", "cost", "data", "parallel", "experiments"])
def test_lower_layers_define_no_checkers_plots_or_benchmarks(layer):
    found = []
    for lay, name, path in _modules():
        if lay != layer:
            continue
        for node in ast.parse(open(path).read()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith(
                    ("check_", "plot_", "bench_")):
                found.append(f"{layer}/{name}.py: {node.name}")
    assert not found, f"these belong in exercises/, viz/ or bench/: {found}"


# The checkers and the course map are tested in test_registry.py.


def test_every_benchmark_is_registered_and_runs_through_run():
    modules = {name for lay, name, _ in _modules()
               if lay == "bench" and name not in ("__init__", "__main__", "suite", "gpucheck", "doctor")}
    assert set(course.benchmarks()) == modules
    for name in modules:
        assert callable(importlib.import_module(f"labutils.bench.{name}").run)


def test_every_lab_names_modules_that_exist():
    for lab in course.LABS:
        unknown = [m for m in lab.modules if m not in course.MODULES]
        assert not unknown, f"{lab.notebook} names modules that do not exist: {unknown}"


def test_preload_names_only_the_layers_ranks_use():
    layers = {path.split(".")[1] for path in course.rank_modules()}
    assert layers <= set(course.RANK_LAYERS)
    assert "labutils.parallel.ddp" in course.rank_modules()


def test_the_face_lists_what_it_resolves():
    names = dir(lu)
    for expected in ("launch", "show_source", "show_solution", "ddp", "pipeline", "planner",
                     "check_sync_gradients"):
        assert expected in names
    assert lu.ddp.BucketedDDP and lu.pipeline and lu.planner.predict


def test_every_directly_imported_package_is_pinned():
    """A package the library, the tools or the tests import is pinned in requirements.txt, not
    just present because something else pulled it in."""
    import sys
    root = os.path.dirname(PACKAGE)
    imported = set()
    for folder in ("labutils", "tools", "tests"):
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in files:
                if name.endswith(".py"):
                    for node in ast.walk(ast.parse(open(os.path.join(dirpath, name)).read())):
                        if isinstance(node, ast.Import):
                            imported |= {a.name.split(".")[0] for a in node.names}
                        elif isinstance(node, ast.ImportFrom) and node.level == 0:
                            imported.add(node.module.split(".")[0])
    tools = {name[:-3] for folder in ("tools", os.path.join("tools", "site"))
             for name in os.listdir(os.path.join(root, folder)) if name.endswith(".py")}
    # tools/ modules import their siblings (zh_catalog uses zh_code, zh_build, zh_migrate; the
    # site's hook tools/site/hooks.py uses stage and mathml)
    third_party = imported - set(sys.stdlib_module_names) - {"labutils", "tests"} - tools
    pinned = {line.split("==")[0].strip().lower().replace("-", "_")
              for line in open(os.path.join(root, "requirements.txt"))
              if "==" in line and not line.startswith("#")}
    import_names = {"ipython": "IPython", "jinja2": "jinja2"}   # distribution -> import name
    provided = {import_names.get(name, name) for name in pinned}
    missing = sorted(third_party - provided)
    assert not missing, f"imported but not pinned in requirements.txt: {missing}"


# Parameters by which a caller threads instrumentation through an algorithm; in parallel/ the
# lesson code observes nothing (counts, spans and memory attach from outside, in experiments/).
_INSTRUMENTATION = {"counter", "timeline", "record", "memory", "measure_memory", "count_messages",
                    "tl", "recorder", "trace"}


def test_lesson_code_takes_no_instrumentation_parameter():
    found = []
    for layer, name, path in _modules():
        if layer != "parallel":
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs}
                found += [f"parallel/{name}.py:{node.lineno} {node.name}({p}=)"
                          for p in sorted(params & _INSTRUMENTATION)]
    assert not found, f"instrumentation threaded through lesson code: {found}"

