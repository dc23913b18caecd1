"""What `pip install .` puts on a cluster: every module of the source tree.

The package list in pyproject.toml is written by hand (dashboards/ and
launchers/ install as hpo.dashboards and hpo.launchers), so a new subpackage
left out of it works in the editable checkout and is missing from a real
install. The wheel is built as pip builds it, and compared with the tree.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT

pytest.importorskip("setuptools", reason="building the wheel needs setuptools in this environment")

# Where each top-level folder of the repository lands in the installed package.
INSTALLED_AS = {"hpo": "hpo", "dashboards": "hpo/dashboards", "launchers": "hpo/launchers"}


def source_files() -> set[str]:
    """The installed paths of every module of a package (a folder with an
    ``__init__.py``; scripts such as dashboards/screenshots/take.py stay out)
    and of the launchers' templates and site profiles."""
    files = set()
    for folder, target in INSTALLED_AS.items():
        for path in (ROOT / folder).rglob("*"):
            relative = path.relative_to(ROOT / folder)
            if "__pycache__" in relative.parts or not path.is_file():
                continue
            in_package = path.suffix == ".py" and (path.parent / "__init__.py").exists()
            if in_package or folder == "launchers" and relative.parts[0] in ("templates", "sites"):
                files.add(f"{target}/{relative.as_posix()}")
    return files


def test_the_wheel_holds_every_module_of_the_tree(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "--quiet", "--wheel-dir", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=240)
    assert build.returncode == 0, build.stderr
    wheel = next(tmp_path.glob("hpo-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        shipped = set(z.namelist())
    missing = sorted(source_files() - shipped)
    assert missing == [], f"pyproject.toml's [tool.setuptools] packages leave out: {missing}"
