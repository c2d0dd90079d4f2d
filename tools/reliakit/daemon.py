"""A `pegainfer serve` process the runner starts itself (--spawn): on a free loopback port, with
its trace-record file and log in the run's work folder and the debug hooks on; its child
processes (the expert ranks) found through /proc; stopped with SIGTERM and its exit status kept."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tools.benchkit.redact import redact_argv

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0


class DaemonError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid`: /proc/PID/task/*/children where the kernel has it, else every
    /proc/*/stat whose parent is `pid`."""
    tasks = Path(f"/proc/{pid}/task")
    listed = [p / "children" for p in tasks.glob("*")] if tasks.is_dir() else []
    if listed and all(p.exists() for p in listed):
        return sorted({int(x) for p in listed for x in p.read_text().split()})
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return sorted(out)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class SpawnedDaemon:
    def __init__(self, index: int, base_flags: list[str], flags: list[str], work_dir: Path):
        self.index = index
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.trace_file = work_dir / f"daemon-{index}.trace.jsonl"
        self.log_path = work_dir / f"daemon-{index}.log"
        self.flags = list(flags)
        self.args = [sys.executable, "-m", "pegainfer.daemon.cli", "serve", "--port", str(self.port),
                     "--trace-file", str(self.trace_file), "--debug-hooks", *base_flags, *flags]
        self.proc: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.ended_by: str | None = None  # runner_sigterm | scenario | forced_kill | crashed
        self.startup_s: float | None = None

    def start(self, timeout: float = START_TIMEOUT_S) -> SpawnedDaemon:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                self.exit_code, self.ended_by = self.proc.returncode, "crashed"
                raise DaemonError(f"daemon {self.index} exited with {self.proc.returncode} before ready:\n"
                                  f"{self.log_tail()}")
            try:
                if httpx.get(self.url + "/ready", timeout=1.0).status_code == 200:
                    self.startup_s = round(time.monotonic() - t0, 3)
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.kill()
        raise DaemonError(f"daemon {self.index} not ready after {timeout:g} s:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def expert_rank_pids(self) -> list[int]:
        """Children that are multiprocessing-spawned workers (the expert ranks); the resource
        tracker, also a child, is left out."""
        return [p for p in child_pids(self.pid) if "spawn_main" in cmdline(p)]

    def logged_ranks(self) -> dict[int, int]:
        """pid -> rank, from the daemon's `expert_rank_ready` log events."""
        out = {}
        for line in self.log_tail(1 << 20).splitlines():
            if '"expert_rank_ready"' in line:
                try:
                    event = json.loads(line)
                    out[int(event["pid"])] = int(event["rank"])
                except (ValueError, KeyError):
                    continue
        return out

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None if it is still running after `timeout` seconds."""
        try:
            self.exit_code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.exit_code

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait()
            self.ended_by = "forced_kill"

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (a drain), then the exit status; a daemon that hangs is killed and None returned."""
        if self.proc is None:
            return None
        if self.alive():
            self.ended_by = "runner_sigterm"
            self.signal(signal.SIGTERM)
            if self.wait(timeout) is None:
                self.kill()
                return None
        elif self.exit_code is None:
            self.exit_code = self.proc.returncode
        return self.exit_code

    def to_dict(self) -> dict:
        return {"index": self.index, "flags": redact_argv(self.flags), "url": self.url, "trace_file": str(self.trace_file),
                "log": str(self.log_path), "startup_s": self.startup_s, "exit_code": self.exit_code,
                "ended_by": self.ended_by}
