"""pegainfer under a real systemd (252 on Debian 12), booted by tools/systemd_smoke.sh as PID 1 of
throwaway namespaces: install-service for real, `systemctl start` blocks until READY=1, the service
runs as its own account, a stuck GPU thread trips WatchdogSec and Restart= brings it back, and
`systemctl stop` drains to a clean exit 0. Skipped, with the reason, where the machine cannot host it
(not root, systemd already PID 1, no unshare/overlayfs/cgroup2)."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.daemon_process import ROOT, free_port

SMOKE = ROOT / "tools" / "systemd_smoke.sh"


def smoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SMOKE), *args], check=False, capture_output=True, text=True, timeout=60)


class Booted:
    def __init__(self, work: Path, port: int):
        self.work = work
        self.url = f"http://127.0.0.1:{port}"

    def ctl(self, *cmd: str, check: bool = True) -> str:
        done = smoke("ctl", str(self.work), *cmd)
        if check:
            assert done.returncode == 0, f"{cmd}: {done.stdout}{done.stderr}\n{self.journal()}"
        return done.stdout.strip()

    def show(self, prop: str) -> str:
        return self.ctl("systemctl", "show", "-P", prop, "pegainfer")

    def journal(self) -> str:
        return smoke("ctl", str(self.work), "journalctl", "--no-pager", "-o", "cat", "-u", "pegainfer").stdout

    def ready_status(self) -> int | None:
        try:
            return httpx.get(self.url + "/ready", timeout=1.0).status_code
        except httpx.TransportError:
            return None


@pytest.fixture
def booted(tmp_path):
    preflight = smoke("preflight")
    if preflight.returncode != 0:
        pytest.skip(preflight.stderr.strip())
    passwd_before = Path("/etc/passwd").read_bytes()
    port = free_port()
    # Half a second of load delay keeps the service visibly `activating` while its HTTP side answers 503.
    (tmp_path / "pegainfer.env.extra").write_text(
        f"PEGAINFER_PORT={port}\nPEGAINFER_DEBUG_HOOKS=true\nPEGAINFER_DEBUG_LOAD_DELAY=0.5\n")
    (tmp_path / "smoke.conf").write_text("[Service]\nWatchdogSec=2s\nRestartSec=500ms\n")
    try:
        up = smoke("up", str(tmp_path))
        assert up.returncode == 0, up.stdout + up.stderr
        yield Booted(tmp_path, port)
    finally:
        smoke("down", str(tmp_path))
        assert Path("/etc/passwd").read_bytes() == passwd_before  # the host never saw the account


def test_service_lifecycle_under_real_systemd(booted):
    b = booted
    assert "created user pegainfer" in (b.work / "install.log").read_text()
    b.ctl("systemctl", "enable", "pegainfer")
    b.ctl("systemctl", "start", "--no-block", "pegainfer")

    # Loading: HTTP answers 503 and systemd still holds the start job open (no READY=1 yet).
    seen_loading = False
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not seen_loading:
        if b.ready_status() == 503:
            seen_loading = b.show("ActiveState") == "activating"
        time.sleep(0.05)
    assert seen_loading, b.journal()

    b.ctl("systemctl", "start", "pegainfer")  # returns once the service is up: READY=1 arrived
    assert b.ready_status() == 200
    assert (b.show("ActiveState"), b.show("SubState"), b.show("StatusText")) == ("active", "running", "serving")
    pid = b.show("MainPID")
    assert b.ctl("stat", "-c", "%U", f"/proc/{pid}") == "pegainfer"
    assert b.ctl("stat", "-c", "%U", "/var/log/pegainfer/traces.jsonl") == "pegainfer"
    # CacheDirectory=: owned by the service user; the compile cache lives there (the default model is package data)
    assert b.ctl("stat", "-c", "%U", "/var/cache/pegainfer") == "pegainfer"
    cached = b.ctl("sh", "-c", "ls /var/cache/pegainfer").split()
    assert "compile" in cached, cached

    # A GPU thread stuck past WatchdogSec: systemd kills the service and Restart=on-failure restarts it.
    assert httpx.post(b.url + "/debug/stall?seconds=60", timeout=5).status_code == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if b.show("NRestarts") == "1" and b.show("ActiveState") == "active":
            break
        time.sleep(0.2)
    assert b.show("NRestarts") == "1" and b.show("ActiveState") == "active", b.journal()
    assert b.show("MainPID") != pid
    assert b.ready_status() == 200
    journal = b.journal()
    assert "Watchdog timeout (limit 2s)!" in journal
    # PYTHONFAULTHANDLER=1: the killed process left the stuck GPU thread's stack in the journal.
    assert "Fatal Python error: Aborted" in journal and "in _apply" in journal, journal

    # Stop: SIGTERM, STOPPING=1, drain, exit 0.
    b.ctl("systemctl", "stop", "pegainfer")
    assert (b.show("Result"), b.show("ExecMainStatus"), b.show("ActiveState")) == ("success", "0", "inactive")
    journal = b.journal()
    assert journal.index('"event":"draining"') < journal.rindex('"event":"stopped","exit_code":0')
