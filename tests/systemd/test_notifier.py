"""Notifier on its own: which environments make one, whose watchdog it is, and the STATUS lines it
derives from the engine's start-up events. A real datagram socket receives every line."""
from __future__ import annotations

import asyncio
import logging

from pegainfer.daemon.notify import ENGINE_LOGGER, EP_LOGGER, Notifier
from pegainfer.engine.engine import log_event
from pegainfer.ep.log import log_event as ep_log_event
from tests.systemd.notify_listener import NotifyListener


def test_no_notifier_outside_systemd():
    assert Notifier.from_env({}) is None
    assert Notifier.from_env({"NOTIFY_SOCKET": "relative/path"}) is None


def test_watchdog_belongs_to_the_pid_systemd_named():
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "2000000"}
    assert Notifier.from_env(env, pid=42).watchdog_s == 2.0
    assert Notifier.from_env({**env, "WATCHDOG_PID": "42"}, pid=42).watchdog_s == 2.0
    assert Notifier.from_env({**env, "WATCHDOG_PID": "41"}, pid=42).watchdog_s is None
    assert Notifier.from_env({**env, "WATCHDOG_USEC": "0"}, pid=42).watchdog_s is None
    assert Notifier.from_env({**env, "WATCHDOG_USEC": "soon"}, pid=42).watchdog_s is None


def test_load_progress_reports_weights_and_expert_ranks(tmp_path, caplog):
    """Weights loaded comes on the engine's logger, expert ranks joining on ep/'s (ep/launch.py)."""
    caplog.set_level(logging.INFO, logger=ENGINE_LOGGER)  # the daemon's default log level
    caplog.set_level(logging.INFO, logger=EP_LOGGER)
    with NotifyListener.at_path(tmp_path) as listener:
        notifier = Notifier(listener.address, None)
        with notifier.load_progress(ep_size=3):
            log_event("weights_loaded", rank=0, shards=4, bytes=31_400_000_000, load_s=61.2)
            ep_log_event("expert_rank_joined", rank=1)
            ep_log_event("expert_rank_joined", rank=2)
        ep_log_event("expert_rank_joined", rank=3)  # after loading: no longer followed
        listener.wait_for(lambda line: "2/2" in line, 2)
        assert listener.lines() == [
            "STATUS=weights loaded: 4 shards, 31.4 GB in 61.2 s; starting expert ranks (0/2 joined)",
            "STATUS=starting expert ranks (1/2 joined)",
            "STATUS=starting expert ranks (2/2 joined)",
        ]


class _Heart:
    def __init__(self):
        self.fresh = True
        self.asked: list[float] = []

    def heartbeat_fresh(self, max_age_s: float) -> bool:
        self.asked.append(max_age_s)
        return self.fresh


async def test_watchdog_pings_only_while_the_heartbeat_is_fresh(tmp_path):
    with NotifyListener.at_path(tmp_path) as listener:
        notifier = Notifier(listener.address, 200_000)  # 0.2 s: a ping every 0.1 s
        heart = _Heart()
        task = asyncio.create_task(notifier.watchdog(heart))
        await asyncio.sleep(0.35)
        heart.fresh = False
        await asyncio.sleep(0.35)
        task.cancel()
        n = len(listener.times("WATCHDOG=1"))
    assert 3 <= n <= 5
    assert set(heart.asked) == {0.2}  # fresh means: alive within one watchdog interval


async def test_no_watchdog_task_without_watchdog_usec(tmp_path):
    notifier = Notifier(str(tmp_path / "none.sock"), None)
    await asyncio.wait_for(notifier.watchdog(_Heart()), 1)  # returns at once
