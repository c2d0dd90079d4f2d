"""A real `pegainfer serve` talking to a real notify socket, as systemd would see it: STATUS lines while
loading, READY=1 only once /ready answers 200, WATCHDOG=1 at half WATCHDOG_USEC while the GPU thread
is alive (and not while it is stuck), STOPPING=1 on SIGTERM, then exit 0."""
from __future__ import annotations

import signal
import time

import httpx
import pytest

from tests.daemon_process import DaemonProcess
from tests.systemd.notify_listener import NotifyListener

WATCHDOG_USEC = 1_000_000  # 1 s: pings every 0.5 s


def _daemon(listener: NotifyListener, *args: str) -> DaemonProcess:
    return DaemonProcess(*args, env={"NOTIFY_SOCKET": listener.address, "WATCHDOG_USEC": str(WATCHDOG_USEC)})


@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_start_and_sigterm_notify_in_order(kind, tmp_path):
    listener = NotifyListener.at_path(tmp_path) if kind == "path" else NotifyListener.abstract()
    # The load delay keeps the daemon loading (HTTP up, /ready 503) long enough to see READY=1 wait.
    daemon = _daemon(listener, "--debug-load-delay", "0.5").start(wait_ready=False)
    try:
        early = []
        while not any(line == "READY=1" for line in listener.lines()):
            assert daemon.proc.poll() is None, daemon.log()
            try:
                early.append(httpx.get(daemon.url + "/ready", timeout=1.0).status_code)
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        # READY=1 has arrived: the daemon must already be serving.
        assert httpx.get(daemon.url + "/ready", timeout=2.0).status_code == 200
        assert 503 in early, "the daemon should have been seen loading before READY=1"
        ready_at = listener.wait_for(lambda line: line == "READY=1", 0)
        time.sleep(1.2)
        pings = [t for t in listener.times("WATCHDOG=1") if t > ready_at]
        assert len(pings) >= 2, listener.lines()
        assert max(b - a for a, b in zip([ready_at, *pings], pings)) < 0.9  # every 0.5 s, with slack

        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, daemon.log()
        lines = listener.lines()
    finally:
        daemon.stop()
        listener.close()

    statuses = [line for line in lines if line.startswith("STATUS=")]
    order = ["STATUS=loading weights", "STATUS=weights loaded", "STATUS=warming up", "READY=1",
             "STATUS=serving", "STOPPING=1", "STATUS=draining"]
    positions = [next(i for i, line in enumerate(lines) if line.startswith(prefix)) for prefix in order]
    assert positions == sorted(positions), lines
    assert lines.count("READY=1") == 1 and lines.count("STOPPING=1") == 1
    assert "tiny-stdlib-trained" in statuses[0] and "local backend" in statuses[0], statuses


def test_stuck_gpu_thread_stops_watchdog_pings_until_it_recovers(tmp_path):
    listener = NotifyListener.at_path(tmp_path)
    with listener, _daemon(listener, "--debug-hooks") as daemon:
        listener.wait_for(lambda line: line == "READY=1", 10)
        time.sleep(1.2)
        before = len(listener.times("WATCHDOG=1"))
        t0 = time.monotonic()
        assert httpx.post(daemon.url + "/debug/stall?seconds=6", timeout=5).status_code == 200
        t1 = time.monotonic()  # the stall command is queued by now
        while time.monotonic() < t0 + 8.0 and len([t for t in listener.times("WATCHDOG=1") if t > t0 + 6]) < 2:
            time.sleep(0.1)
        # The HTTP side stayed up the whole time: only the GPU thread was stuck.
        assert httpx.get(daemon.url + "/health", timeout=2).status_code == 200
        pings = listener.times("WATCHDOG=1")

    assert before >= 2
    # The last heartbeat came before the stall command was queued (t1); pings may go on for up to one
    # watchdog interval (1 s) after it, plus one ping period. Then silence until the GPU thread wakes.
    silent = [round(t - t0, 2) for t in pings if t1 + 1.6 < t < t0 + 5.9]
    assert silent == [], f"pings while the GPU thread was stuck, at t0+{silent}"
    resumed = [t - t0 for t in pings if t > t0 + 6.0]
    assert resumed and resumed[0] < 7.5, f"pings did not resume after the stall: {resumed}"
    assert len(resumed) >= 2
