"""`pegainfer install-service --prefix`: the real command, into a temporary root. It writes the unit
(ExecStart = this pegainfer), the config and env file, creates the account with the real useradd when
the root has an /etc/passwd, never overwrites a config, and a second run changes nothing."""
from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pegainfer.daemon.cli import build_parser, main
from pegainfer.daemon.settings import resolve
from tests.daemon_process import ROOT

UNIT = "etc/systemd/system/pegainfer.service"
CONFIG = "etc/pegainfer/pegainfer.toml"
ENV = "etc/pegainfer/pegainfer.env"


@dataclasses.dataclass
class Run:
    stdout: str
    stderr: str


def install(prefix: Path, *extra: str, capsys) -> Run:
    """In-process `pegainfer install-service` (the same main() the console script calls)."""
    code = main(["install-service", "--prefix", str(prefix), *extra])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    return Run(out, err)


def snapshot(prefix: Path) -> dict[str, tuple[bytes, int, int]]:
    return {str(p.relative_to(prefix)): (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_mode)
            for p in sorted(prefix.rglob("*")) if p.is_file()}


def test_installs_unit_config_and_env_then_changes_nothing(tmp_path, capsys):
    script = Path(sys.executable).parent / "pegainfer"  # the console script, as a user runs it
    first = subprocess.run([str(script), "install-service", "--prefix", str(tmp_path)],
                           check=False, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stdout + first.stderr
    assert {UNIT, CONFIG, ENV} == set(snapshot(tmp_path))
    unit = (tmp_path / UNIT).read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    exe = exec_start.removeprefix("ExecStart=").split()[0]
    assert Path(exe).is_absolute() and os.access(exe, os.X_OK), exec_start
    assert Path(exe).parent == Path(sys.executable).parent  # this venv's pegainfer
    assert exec_start.endswith(" serve --config /etc/pegainfer/pegainfer.toml")
    assert (tmp_path / CONFIG).read_text() == (ROOT / "systemd/pegainfer.toml").read_text()
    assert (tmp_path / ENV).stat().st_mode & 0o777 == 0o640  # may hold the API key
    assert "skipped user pegainfer" in first.stdout  # no etc/passwd under this root: accounts untouched

    before = snapshot(tmp_path)
    second = install(tmp_path, capsys=capsys)
    assert snapshot(tmp_path) == before
    assert "nothing to change" in second.stdout


def test_never_overwrites_a_config_but_repairs_the_unit(tmp_path, capsys):
    install(tmp_path, capsys=capsys)
    (tmp_path / CONFIG).write_text('port = 9000\n')
    (tmp_path / UNIT).write_text("[Service]\nExecStart=/bin/false\n")
    out = install(tmp_path, capsys=capsys).stdout
    assert (tmp_path / CONFIG).read_text() == 'port = 9000\n'
    assert "ExecStart=/bin/false" not in (tmp_path / UNIT).read_text()
    assert f"wrote {tmp_path / UNIT}" in out and f"kept {tmp_path / CONFIG}" in out


def test_dry_run_changes_nothing(tmp_path, capsys):
    out = install(tmp_path, "--dry-run", capsys=capsys).stdout
    assert list(tmp_path.iterdir()) == []
    assert f"would write {tmp_path / UNIT}" in out


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                    reason="needs root and useradd (passwd package) to create an account under a prefix")
def test_creates_the_account_once_with_useradd(tmp_path, capsys):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (etc / "group").write_text("root:x:0:\nvideo:x:44:\n")
    install(tmp_path, "--user", "pegatest", capsys=capsys)
    user = [line for line in (etc / "passwd").read_text().splitlines() if line.startswith("pegatest:")]
    assert len(user) == 1 and user[0].endswith(":/var/lib/pegainfer:/usr/sbin/nologin"), user
    gid = int(user[0].split(":")[3])
    groups = [line.split(":") for line in (etc / "group").read_text().splitlines()]
    assert ["pegatest", gid] in [[g[0], int(g[2])] for g in groups]
    assert (tmp_path / CONFIG).stat().st_gid == gid  # the service reads its config through its group
    unit = (tmp_path / UNIT).read_text().splitlines()
    # the GPU groups that exist under this root: video yes, render no
    assert {"User=pegatest", "Group=pegatest", "SupplementaryGroups=video"} <= set(unit)

    before = snapshot(tmp_path)
    out = install(tmp_path, "--user", "pegatest", capsys=capsys).stdout
    assert "unchanged user pegatest" in out and "nothing to change" in out
    assert snapshot(tmp_path) == before


def test_rejects_a_bad_account_name(tmp_path, capsys):
    assert main(["install-service", "--prefix", str(tmp_path), "--user", "Bad Name"]) == 1
    assert "not a valid account name" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_installed_service_runs_without_debug_hooks(tmp_path, capsys):
    """The settings the installed unit starts `pegainfer serve` with (its ExecStart flags, its
    Environment= lines, the env file and the config, as systemd and the daemon read them) leave
    every debug setting off: /debug/stall and /debug/fail can stall and fail the engine on demand."""
    install(tmp_path, capsys=capsys)
    unit = (tmp_path / UNIT).read_text().splitlines()
    argv = shlex.split(next(line for line in unit if line.startswith("ExecStart=")).removeprefix("ExecStart="))
    flags = argv[argv.index("serve") + 1:]
    flags[flags.index("--config") + 1] = str(tmp_path / CONFIG)
    environ = {}
    env_lines = [line.removeprefix("Environment=") for line in unit if line.startswith("Environment=")]
    env_lines += [line for line in (tmp_path / ENV).read_text().splitlines() if line and not line.startswith("#")]
    for line in env_lines:
        name, _, value = line.partition("=")
        environ[name] = value
    settings = resolve(build_parser().parse_args(["serve", *flags]), environ)
    assert (settings.debug_hooks, settings.debug_traces, settings.debug_load_delay) == (False, False, 0.0)
    assert not any(name.startswith("PEGAINFER_DEBUG") for name in environ)
    assert not any("debug" in flag for flag in flags)
