"""A real `pegainfer serve` process on a free loopback port, for end-to-end tests."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaemonProcess:
    def __init__(self, *args: str, env: dict[str, str] | None = None, log_path: Path | None = None,
                 preexec_fn=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [sys.executable, "-m", "pegainfer.daemon.cli", "serve", "--port", str(self.port), *args]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.log_path = log_path
        self.preexec_fn = preexec_fn  # runs in the child before exec (e.g. a lower descriptor limit)
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self, wait_ready: bool = True, timeout: float = 120.0) -> DaemonProcess:
        if self.log_path is None:
            import tempfile
            self.log_path = Path(tempfile.mkstemp(prefix="pegainfer-daemon-", suffix=".log")[1])
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=self.preexec_fn)
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode} before ready:\n{self.log()}")
            try:
                if httpx.get(self.url + "/ready", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"daemon not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self._log:
                self._log.close()

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                return self.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        return self.proc.returncode

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
