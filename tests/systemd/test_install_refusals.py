"""`pegainfer install-service --dry-run` as a user runs it (the console script, a process): a service
that would serve random weights, a pegainfer or model under /tmp (hidden by the unit's
PrivateTmp=yes), a model folder that is not one and a bad --device are refused with one line and exit
status 2, before anything changes; --no-private-tmp writes PrivateTmp=no instead. The processes run
side by side: each imports torch."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.systemd.test_install_service import where_flags

SCRIPT = Path(sys.executable).parent / "pegainfer"  # the console script


@pytest.fixture
def tmp_program():
    """The console script, reached through a link under /tmp (as a venv made in /tmp would be)."""
    folder = Path(tempfile.mkdtemp(prefix="pegainfer-bin-", dir="/tmp"))
    (folder / "pegainfer").symlink_to(SCRIPT)
    yield folder / "pegainfer"
    shutil.rmtree(folder)


def run_all(cases: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess]:
    procs = {name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, argv in cases.items()}
    out = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=120)
        out[name] = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    return out


def test_refusals_are_one_line_exit_2_and_change_nothing(tmp_path, tmp_program):
    prefix = tmp_path / "root"
    prefix.mkdir()
    (prefix / "var/lib/pegainfer/models/empty").mkdir(parents=True)
    lite = tmp_path / "lite.toml"
    lite.write_text('random_preset = "lite"\n')

    def cli(*args: str, program: Path = SCRIPT) -> list[str]:
        return [str(program), "install-service", "--dry-run", "--prefix", str(prefix), *args]
    ok = where_flags()
    cases = {
        "tiny": (cli(*ok), ["the service would serve the embedded tiny model", "--model DIR", "--allow-tiny-model"]),
        "random": (cli("--config", str(lite), *ok), ["random weights of the lite preset", "--allow-tiny-model"]),
        "not a model": (cli("--model", "/var/lib/pegainfer/models/empty", *ok),
                        ["not a model folder", "config.json", "tokenizer.json", "model.safetensors"]),
        "pegainfer in /tmp": (cli("--allow-tiny-model", program=tmp_program),
                              [str(tmp_program), "PrivateTmp=yes", "--no-private-tmp"]),
        "device": (cli("--device", "gpu", *ok), ["--device", "'gpu' is not a device"]),
    }
    if not ok:  # with --no-private-tmp (this checkout is under /tmp) a model there is fine
        cases["model in /tmp"] = (cli("--model", "/tmp/models/x"), ["/tmp/models/x", "PrivateTmp=yes",
                                                                   "--no-private-tmp"])
    done = run_all({name: argv for name, (argv, _) in cases.items()})
    for name, (_, needles) in cases.items():
        p = done[name]
        assert p.returncode == 2, (name, p.stdout, p.stderr)
        [line] = p.stderr.splitlines()
        assert "Traceback" not in p.stderr and line.startswith("pegainfer"), (name, p.stderr)
        assert all(n in line for n in needles), (name, line)
        assert "would" not in p.stdout, (name, p.stdout)  # refused before anything was planned
    assert sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*")) == [
        "var", "var/lib", "var/lib/pegainfer", "var/lib/pegainfer/models", "var/lib/pegainfer/models/empty"]


def test_no_private_tmp_installs_a_pegainfer_under_tmp(tmp_path, tmp_program):
    done = subprocess.run([str(tmp_program), "install-service", "--prefix", str(tmp_path), "--allow-tiny-model",
                           "--no-private-tmp"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    unit = (tmp_path / "etc/systemd/system/pegainfer.service").read_text().splitlines()
    assert "PrivateTmp=no" in unit and "PrivateTmp=yes" not in unit
    assert f"ExecStart={tmp_program} serve --config /etc/pegainfer/pegainfer.toml" in unit
    assert os.access(tmp_path / "etc/pegainfer/pegainfer.toml", os.R_OK)
