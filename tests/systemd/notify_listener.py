"""The systemd end of sd_notify for tests: a unix datagram socket (a path, or an abstract '@name')
that records every notification with its arrival time, on a background thread."""
from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Self


class NotifyListener:
    def __init__(self, address: str):
        self.address = address  # what goes into $NOTIFY_SOCKET
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []  # (time.monotonic(), one KEY=VALUE line)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @classmethod
    def at_path(cls, folder: Path) -> NotifyListener:
        return cls(str(folder / "notify.sock"))

    @classmethod
    def abstract(cls) -> NotifyListener:
        return cls(f"@pegainfer-test-{os.getpid()}-{uuid.uuid4().hex[:8]}")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            now = time.monotonic()
            with self._lock:
                self.messages += [(now, line) for line in data.decode().split("\n") if line]

    def lines(self) -> list[str]:
        with self._lock:
            return [line for _, line in self.messages]

    def times(self, line: str) -> list[float]:
        with self._lock:
            return [t for t, m in self.messages if m == line]

    def wait_for(self, match: Callable[[str], bool], timeout: float) -> float:
        """Arrival time of the first line that matches; TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                for t, line in self.messages:
                    if match(line):
                        return t
            if time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        raise TimeoutError(f"no matching notification in {timeout}s; got {self.lines()}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)
        self.sock.close()
        if not self.address.startswith("@"):
            Path(self.address).unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
