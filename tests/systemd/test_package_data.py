"""pegainfer installed from its wheel (not an editable checkout) carries the systemd unit, the example
settings and environment file (package data pegainfer.systemd) and the Apache-2.0 licence, and its
`install-service` installs them from there. The wheel is built offline from a copy of the sources
(pip wheel --no-build-isolation: the venv's setuptools), so the checkout gets no build/ or egg-info."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.daemon_process import ROOT

SHIPPED = ("pegainfer.service", "pegainfer.toml", "pegainfer.env")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for folder in folders:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    [built] = out.glob("pegainfer-*.whl")
    return built


def test_the_wheel_holds_the_systemd_files_and_the_licence(wheel):
    with zipfile.ZipFile(wheel) as z:
        for name in SHIPPED:
            assert z.read(f"pegainfer/systemd/{name}") == (ROOT / "systemd" / name).read_bytes(), name
        [licence] = [n for n in z.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert z.read(licence) == (ROOT / "LICENSE").read_bytes()
        [metadata] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        assert "License-Expression: Apache-2.0" in z.read(metadata).decode().splitlines()


def test_install_service_from_the_installed_wheel(wheel, tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                           str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    env = {**os.environ, "PYTHONPATH": str(site)}  # the wheel's pegainfer only, not this checkout's
    probe = subprocess.run([sys.executable, "-c", "import importlib.resources as r, pegainfer.daemon.cli as c; "
                            "print(c.__file__); print(r.files('pegainfer.systemd'))"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert all(Path(line).is_relative_to(site) for line in probe.stdout.split()), probe.stdout

    root = tmp_path / "root"
    # site is under a tmp folder, which the unit's PrivateTmp=yes would hide: --no-private-tmp.
    done = subprocess.run([sys.executable, "-m", "pegainfer.daemon.cli", "install-service", "--prefix", str(root),
                           "--allow-tiny-model", "--no-private-tmp"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (root / "etc/pegainfer/pegainfer.toml").read_bytes() == (ROOT / "systemd/pegainfer.toml").read_bytes()
    assert (root / "etc/pegainfer/pegainfer.env").read_bytes() == (ROOT / "systemd/pegainfer.env").read_bytes()
    unit = (root / "etc/systemd/system/pegainfer.service").read_text()
    assert "Type=notify" in unit and "PrivateTmp=no" in unit


def test_the_wheel_holds_the_trained_default_model(wheel):
    """`pegainfer serve` without --model serves engine/data/tiny-stdlib-trained: package data, file for file."""
    folder = ROOT / "engine" / "data" / "tiny-stdlib-trained"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for path in sorted(folder.iterdir()):
            assert z.read(f"pegainfer/engine/data/tiny-stdlib-trained/{path.name}") == path.read_bytes(), path.name
        assert "pegainfer/engine/data/corpus.txt" in names
