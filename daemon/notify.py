"""systemd notifications over $NOTIFY_SOCKET (sd_notify's datagram protocol, abstract sockets too):
STATUS during load, READY=1 once serving, WATCHDOG=1 while the GPU thread's heartbeat is fresh,
STOPPING=1 when draining starts."""
from __future__ import annotations

import asyncio
import os
import socket


class Notifier:
    def __init__(self, address: str, watchdog_usec: int | None):
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_s = watchdog_usec / 1e6 if watchdog_usec else None
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Notifier | None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET")
        if not address:
            return None
        usec = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        if pid and pid.isdigit() and int(pid) != os.getpid():
            usec = None  # the watchdog is meant for another process
        return cls(address, int(usec) if usec and usec.isdigit() else None)

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

    async def watchdog(self, runtime) -> None:
        """Ping at half the watchdog interval, only while the GPU thread proves it is alive."""
        if not self.watchdog_s:
            return
        interval = self.watchdog_s / 2
        while True:
            if runtime.heartbeat_fresh(max_age_s=self.watchdog_s / 2):
                self.send("WATCHDOG=1")
            await asyncio.sleep(interval)
