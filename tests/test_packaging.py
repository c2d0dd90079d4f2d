"""The installed distribution exposes one import package, `pegainfer`, whose subpackages are the
top-level folders (pyproject.toml maps them): the list of packages there is every package folder of
the tree, and an installed pegainfer adds no top-level `daemon`, `engine`, `ep`, `lifecycle` or
`telemetry` module that could shadow another distribution's."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from tests import layering as L

ROOT = Path(__file__).resolve().parents[1]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


DATA_PACKAGES = ("systemd",)  # shipped files, no code (install-service reads them through importlib.resources)


def test_every_package_folder_is_installed_under_pegainfer():
    tree = {"pegainfer." + ".".join(p.parent.relative_to(ROOT).parts)
            for pkg in (*L.PACKAGES, *DATA_PACKAGES) for p in (ROOT / pkg).rglob("__init__.py")}
    assert set(_setuptools()["packages"]) == tree
    assert _setuptools()["package-dir"] == {f"pegainfer.{pkg}": pkg for pkg in (*L.PACKAGES, *DATA_PACKAGES)}


def test_the_systemd_files_are_package_data_and_the_licence_is_named():
    shipped = set(_setuptools()["package-data"]["pegainfer.systemd"])
    assert shipped == {p.name for p in (ROOT / "systemd").iterdir() if p.suffix in (".service", ".toml", ".env")}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert (project["license"], project["license-files"]) == ("Apache-2.0", ["LICENSE"])
    assert (ROOT / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]


def test_the_console_script_runs_the_packaged_cli():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"pegainfer": "pegainfer.daemon.cli:main"}


def test_the_install_adds_no_bare_top_level_module(tmp_path):
    """Run outside the checkout, so that only what is installed can be found."""
    probe = ("import importlib.util as u; import pegainfer.engine.contract, pegainfer.daemon.cli; "
             "print([n for n in ('daemon', 'engine', 'ep', 'lifecycle', 'telemetry') if u.find_spec(n)])")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
