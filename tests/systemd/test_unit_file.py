"""systemd/pegainfer.service: systemd's own checker accepts it without a single warning once rendered
for this host, its security score stays in systemd's "OK" band, and its timeouts fit the daemon's."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pegainfer.daemon.install_service import Installer, entry_point
from pegainfer.daemon.settings import Settings

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "pegainfer.service"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze missing: apt-get install -y --no-install-recommends systemd")


def _directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def _seconds(value: str) -> float:
    units = {"s": 1, "min": 60, "h": 3600}
    return sum(float(n) * units[u or "s"] for n, u in re.findall(r"(\d+(?:\.\d+)?)\s*(min|h|s)?", value))


def analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([ANALYZE, *args], check=False, capture_output=True, text=True, timeout=60)


@pytest.fixture
def rendered(tmp_path) -> Path:
    """The unit as install-service would write it on this host (this checkout's pegainfer, its groups)."""
    path = tmp_path / "pegainfer.service"
    path.write_text(Installer(Path("/"), "pegainfer", True, entry_point()).render_unit())  # reads only
    return path


@needs_analyze
def test_systemd_analyze_verify_is_silent(rendered):
    done = analyze("verify", "--man=no", str(rendered))
    # verify exits 0 even for unknown keys and unparsable values: any output at all is a finding.
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr


@needs_analyze
def test_systemd_analyze_verify_catches_a_broken_unit(rendered):
    rendered.write_text(rendered.read_text().replace("WatchdogSec=30s", "WatchdogSec=soon\nWatchdogSecs=30s"))
    done = analyze("verify", "--man=no", str(rendered))
    assert "WatchdogSecs" in done.stderr and "soon" in done.stderr


@needs_analyze
def test_security_exposure_stays_ok(rendered):
    done = analyze("security", "--offline=yes", "--no-pager", str(rendered))
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout)
    assert m, done.stdout[-2000:] + done.stderr
    assert float(m.group(1)) <= 4.0, done.stdout[-2000:]


def test_unit_keeps_gpus_reachable_and_fits_the_daemon():
    d = _directives(UNIT.read_text())
    assert d["Type"] == ["notify"] and d["NotifyAccess"] == ["main"]
    assert d["ExecStart"][0].endswith("pegainfer serve --config /etc/pegainfer/pegainfer.toml")
    assert d["PrivateDevices"] == ["no"] and d["DevicePolicy"] == ["closed"]
    allowed = {v.split()[0] for v in d["DeviceAllow"]}
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "char-nvidia-frontend", "char-nvidia-uvm"} <= allowed
    assert "MemoryDenyWriteExecute" not in d  # triton and CUDA JIT need W+X pages
    assert d["LimitMEMLOCK"] == ["infinity"] and d["KillMode"] == ["mixed"]
    # systemd must not kill a drain that is still within its own deadline
    assert _seconds(d["TimeoutStopSec"][0]) >= Settings().drain_timeout + 15
    assert _seconds(d["TimeoutStartSec"][0]) >= 10 * 60
    assert 10 <= _seconds(d["WatchdogSec"][0]) <= 120
    assert {"StateDirectory", "CacheDirectory", "LogsDirectory"} <= set(d)
    env = dict(v.split("=", 1) for v in d["Environment"])
    assert env["PEGAINFER_TRACE_FILE"] == "%L/pegainfer/traces.jsonl"
    assert env["PEGAINFER_CACHE_DIR"] == "%C/pegainfer"
