"""The course site, built once per pytest session for tests/test_site.py and
tests/test_site_browser.py: `mkdocs build` with the repository's mkdocs.yml, its staging folder
and output under the session's temporary folder (a config that INHERITs mkdocs.yml), so a test
run never touches build/ or _site/. About 30 s on 2 cores."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_BUILT = {}


def course_site(tmp_path_factory):
    """(site folder, the finished `mkdocs build` process) of this session's build."""
    if "site" not in _BUILT:
        work = tmp_path_factory.mktemp("course-site")
        (work / "docs").mkdir()
        config = work / "mkdocs.yml"
        config.write_text(f"INHERIT: {ROOT / 'mkdocs.yml'}\ndocs_dir: {work / 'docs'}\n"
                          f"site_dir: {work / 'site'}\nhooks:\n"
                          f"  - {ROOT / 'tools' / 'site' / 'hooks.py'}\n")
        run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                              str(config)], cwd=ROOT, capture_output=True, text=True,
                             timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
        _BUILT["site"] = (work / "site", run)
    return _BUILT["site"]


def load_site_module(name):
    """tools/site/<name>.py (tools/site/ is no package; its modules import each other)."""
    folder = ROOT / "tools" / "site"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
