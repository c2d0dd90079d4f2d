"""`pegainfer install-service --prefix`: the real command, into a temporary root. It writes the unit
(ExecStart = this pegainfer), the config (with --model and --device set in it) and env file, creates
the account with the real useradd when the root has an /etc/passwd, never overwrites a config (and
refuses one that contradicts what was asked), and a second run changes nothing. The refusals run as
processes in test_install_refusals.py; an install from a wheel in test_package_data.py."""
from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pegainfer.daemon.cli import build_parser, main
from pegainfer.daemon.install_service import HIDDEN_BY_PRIVATE_TMP, Installer, entry_point
from pegainfer.daemon.service_config import service_settings
from pegainfer.daemon.settings import Settings, resolve
from tests.daemon_process import ROOT

UNIT = "etc/systemd/system/pegainfer.service"
CONFIG = "etc/pegainfer/pegainfer.toml"
ENV = "etc/pegainfer/pegainfer.env"
MODEL = "/var/lib/pegainfer/models/tiny"  # as the service sees it; under the prefix in these tests


def where_flags() -> list[str]:
    """--no-private-tmp where this checkout or its Python lives under /tmp (a CI clone may): there
    install-service refuses, rightly, to write a unit whose PrivateTmp=yes would hide it."""
    paths = Installer(Path("/"), "pegainfer", True, entry_point()).program_paths()
    return ["--no-private-tmp"] if any((p + "/").startswith(HIDDEN_BY_PRIVATE_TMP) for p in paths) else []


@pytest.fixture
def model_under(tiny_model_dir):
    """model_under(prefix): the tiny checkpoint at prefix/MODEL; returns MODEL."""
    def put(prefix: Path) -> str:
        link = prefix / MODEL.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(tiny_model_dir)
        return MODEL
    return put


@dataclasses.dataclass
class Run:
    stdout: str
    stderr: str


def install(prefix: Path, *extra: str, capsys, code: int = 0) -> Run:
    """In-process `pegainfer install-service` (the same main() the console script calls); without
    --model it serves the embedded tiny model, which needs --allow-tiny-model."""
    flags = [*extra, *where_flags()] if "--model" in extra else [*extra, "--allow-tiny-model", *where_flags()]
    got = main(["install-service", "--prefix", str(prefix), *flags])
    out, err = capsys.readouterr()
    assert got == code, out + err
    return Run(out, err)


def snapshot(prefix: Path) -> dict[str, tuple[bytes, int, int]]:
    return {str(p.relative_to(prefix)): (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_mode)
            for p in sorted(prefix.rglob("*")) if p.is_file()}


def test_installs_unit_config_and_env_then_changes_nothing(tmp_path, capsys):
    script = Path(sys.executable).parent / "pegainfer"  # the console script, as a user runs it
    first = subprocess.run([str(script), "install-service", "--prefix", str(tmp_path), "--allow-tiny-model",
                            *where_flags()], check=False, capture_output=True, text=True, timeout=60)
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
    assert "the service will serve the embedded tiny model" in first.stdout
    assert "warning: the service will serve the embedded tiny model" in first.stderr  # --allow-tiny-model

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
    assert "not a valid account name" in install(tmp_path, "--user", "Bad Name", capsys=capsys, code=2).stderr
    assert list(tmp_path.iterdir()) == []


def test_model_and_device_are_written_into_the_config(tmp_path, capsys, model_under):
    model = model_under(tmp_path)
    out = install(tmp_path, "--model", model, "--device", "cuda:0", capsys=capsys).stdout
    assert f"the service will serve {model} on cuda:0" in out
    config = (tmp_path / CONFIG).read_text()
    assert f'model = "{model}"' in config.splitlines() and 'device = "cuda:0"' in config.splitlines()
    # The settings the daemon resolves under the installed unit, env file and config:
    settings, where = service_settings((tmp_path / UNIT).read_text(), (tmp_path / ENV).read_text(), config)
    assert (settings.model, settings.device) == (model, "cuda:0")
    assert where["model"] == "/etc/pegainfer/pegainfer.toml: model"
    changed = {k for k in Settings.field_names() if getattr(settings, k) != getattr(Settings(), k)}
    assert changed == {"model", "device", "trace_file", "compile_cache_dir"}  # the last two: the unit's Environment=

    before = snapshot(tmp_path)
    assert "nothing to change" in install(tmp_path, "--model", model, "--device", "cuda:0", capsys=capsys).stdout
    assert "nothing to change" in install(tmp_path, "--model", model, capsys=capsys).stdout  # the config says cuda:0
    err = install(tmp_path, "--model", model, "--device", "cpu", capsys=capsys, code=2).stderr
    assert err.count("\n") == 1 and "device = 'cuda:0', not device = 'cpu'" in err, err
    assert snapshot(tmp_path) == before  # a contradicting install changes nothing


def test_a_settings_file_is_installed_with_the_model_set_in_it(tmp_path, capsys, model_under):
    model = model_under(tmp_path)
    mine = tmp_path / "mine.toml"
    mine.write_text('# my settings\nport = 9000\nmax_active = 4\nmodel = "/elsewhere"\n')
    install(tmp_path, "--config", str(mine), "--model", model, capsys=capsys)
    installed = (tmp_path / CONFIG).read_text()
    assert installed.startswith("# my settings\n")
    assert tomllib.loads(installed) == {"port": 9000, "max_active": 4, "model": model}


def test_a_settings_file_the_daemon_would_refuse_is_refused(tmp_path, capsys, model_under):
    model = model_under(tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text('log_level = "verbose"\n')
    err = install(tmp_path, "--config", str(bad), "--model", model, capsys=capsys, code=2).stderr
    assert err.startswith(f"pegainfer: error: {bad}: log_level: 'verbose' is not a log level"), err
    assert not (tmp_path / "etc").exists()


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
