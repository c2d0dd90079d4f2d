"""systemd notifications over $NOTIFY_SOCKET (sd_notify's datagram protocol, abstract '@' sockets too):
STATUS lines while loading (weights, expert ranks, warm-up), READY=1 once serving, WATCHDOG=1 while the
GPU thread's heartbeat is fresh, STOPPING=1 when draining starts. Without $NOTIFY_SOCKET there is no
Notifier at all, so a daemon started by hand pays nothing."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from typing import Protocol

import orjson

# The engine and ep/ announce start-up milestones as one JSON object per line on these loggers
# (log_event): weights loaded on the engine's, expert ranks joining on ep/'s.
ENGINE_LOGGER = "pegainfer.engine"
EP_LOGGER = "pegainfer.ep"


class Heartbeat(Protocol):
    def heartbeat_fresh(self, max_age_s: float) -> bool: ...


class Notifier:
    def __init__(self, address: str, watchdog_usec: int | None):
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_s = watchdog_usec / 1e6 if watchdog_usec else None
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, pid: int | None = None) -> Notifier | None:
        """None outside systemd. WATCHDOG_USEC counts only when WATCHDOG_PID is absent or names us
        (sd_watchdog_enabled's rule: a watchdog set for a parent must not be fed by a child)."""
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET")
        if not address or address[0] not in "/@":
            return None  # sd_notify accepts only absolute paths and abstract names
        usec = env.get("WATCHDOG_USEC", "")
        owner = env.get("WATCHDOG_PID", "")
        if owner and owner != str(os.getpid() if pid is None else pid):
            usec = ""
        return cls(address, int(usec) if usec.isdigit() and int(usec) > 0 else None)

    def send(self, *lines: str) -> None:
        try:
            self.sock.sendto("\n".join(lines).encode(), self.address)
        except OSError:
            pass  # systemd gone or socket closed: notifications are best effort

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def ready(self) -> None:
        self.send("READY=1", "STATUS=serving")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=draining")

    @contextlib.contextmanager
    def load_progress(self, ep_size: int) -> Iterator[None]:
        """While loading, turn the engine's start-up events into STATUS lines (weights loaded, expert
        ranks joining), so `systemctl status` shows where a long load is. The events are info-level
        log records: with log_level warning or above only the runtime's own STATUS lines remain."""
        handler = _LoadProgress(self, ep_size)
        loggers = [logging.getLogger(name) for name in (ENGINE_LOGGER, EP_LOGGER)]
        for logger in loggers:
            logger.addHandler(handler)
        try:
            yield
        finally:
            for logger in loggers:
                logger.removeHandler(handler)

    async def watchdog(self, runtime: Heartbeat) -> None:
        """Ping at half the watchdog interval, only while the GPU thread has proved it is alive within
        the last interval: a stuck GPU thread (or a stuck event loop) stops the pings, and systemd
        kills and restarts the service one interval later."""
        if not self.watchdog_s:
            return
        while True:
            if runtime.heartbeat_fresh(max_age_s=self.watchdog_s):
                self.send("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_s / 2)


class _LoadProgress(logging.Handler):
    def __init__(self, notifier: Notifier, ep_size: int):
        super().__init__(logging.INFO)
        self.notifier = notifier
        self.ep_size = ep_size
        self.joined = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            event = orjson.loads(record.getMessage())
        except (orjson.JSONDecodeError, TypeError):
            return
        if not isinstance(event, dict):
            return
        name = event.get("event")
        if name == "weights_loaded":
            text = (f"weights loaded: {event.get('shards', 0)} shards, {_size(event.get('bytes', 0))} "
                    f"in {event.get('load_s', 0):.1f} s")
            if self.ep_size > 1:
                text += f"; starting expert ranks (0/{self.ep_size - 1} joined)"
            self.notifier.status(text)
        elif name == "expert_rank_joined":
            self.joined += 1
            self.notifier.status(f"starting expert ranks ({self.joined}/{self.ep_size - 1} joined)")


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
