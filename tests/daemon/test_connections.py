"""daemon/connections.py: the connection budget derived from the queue and the descriptor limit,
and the guard's admission (serve, evict the longest-idle, refuse with 503, drop past the ceiling)."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from pegainfer.daemon.connections import (
    BURST_ROOM,
    EVICT_GRACE_S,
    PROBE_MARGIN,
    RESERVE_FDS,
    RESERVE_FDS_PER_RANK,
    Admission,
    ConnectionBudget,
    ConnectionGuard,
    plan_budget,
)
from pegainfer.daemon.settings import Settings, SettingsError, resolve

BIG = 1 << 20


def test_default_cap_is_twice_the_queue_plus_probes():
    b = plan_budget(Settings(), BIG, BIG)
    assert b.max_connections == b.wanted == 2 * (8 + 64) + PROBE_MARGIN  # CPU: 8 slots by default
    assert not b.too_low and b.nofile == BIG
    cuda = plan_budget(dataclasses.replace(Settings(), device="cuda"), BIG, BIG)
    assert cuda.max_connections == 2 * (1024 + 64) + PROBE_MARGIN  # as many sequences as the engine may run
    given = plan_budget(dataclasses.replace(Settings(), max_active=4, max_pending=6), BIG, BIG)
    assert given.max_connections == 2 * 10 + PROBE_MARGIN
    assert plan_budget(dataclasses.replace(Settings(), max_connections=5), BIG, BIG).max_connections == 5


def test_a_low_soft_limit_is_raised_as_far_as_needed():
    b = plan_budget(Settings(), 256, BIG)
    need = RESERVE_FDS + RESERVE_FDS_PER_RANK + b.wanted + max(b.wanted // 4, BURST_ROOM)
    assert b.nofile == need and b.max_connections == b.wanted and not b.too_low
    assert b.ceiling == need - RESERVE_FDS - RESERVE_FDS_PER_RANK > b.max_connections


def test_a_low_hard_limit_bounds_the_cap_and_says_so():
    b = plan_budget(Settings(), 256, 256)
    room = 256 - RESERVE_FDS - RESERVE_FDS_PER_RANK
    assert (b.nofile, b.ceiling, b.max_connections) == (256, room, room * 4 // 5)
    assert b.too_low and b.max_connections < b.wanted
    wide = plan_budget(dataclasses.replace(Settings(), ep_size=8), 512, 512)
    assert wide.ceiling == 512 - RESERVE_FDS - 8 * RESERVE_FDS_PER_RANK  # each expert rank needs descriptors


def test_even_a_tiny_limit_leaves_one_connection():
    b = plan_budget(Settings(), 64, 64)
    assert b.max_connections >= 1 and b.ceiling >= 2 and b.too_low


class Conn:
    def __init__(self, name: str):
        self.name, self.evicted = name, False

    def evict(self) -> None:
        self.evicted = True


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def guard(cap: int, ceiling: int, clock=None) -> ConnectionGuard:
    return ConnectionGuard(ConnectionBudget(cap, ceiling, cap, 1024, 1024), **({"clock": clock} if clock else {}))


def test_at_the_cap_the_longest_idle_connection_makes_room():
    g = guard(3, 5)
    a, b, c = Conn("a"), Conn("b"), Conn("c")
    for x in (a, b, c):
        assert g.admit(x) is Admission.SERVE
        g.idle(x)  # each served a request and waits, kept alive
    g.busy(a)  # a is serving a request: never evicted
    g.idle(b)  # b finished a request: now the most recent idle one
    d = Conn("d")
    assert g.admit(d) is Admission.SERVE and c.evicted and not (a.evicted or b.evicted)
    assert g.open == 3 and g.evicted == 1
    g.release(c)  # its connection_lost comes later: counted once
    assert g.open == 3


def test_with_every_connection_busy_new_ones_are_refused_then_dropped():
    g = guard(2, 3)
    busy = [Conn(str(i)) for i in range(2)]
    for x in busy:
        assert g.admit(x) is Admission.SERVE
        g.busy(x)
    refused, dropped = Conn("r"), Conn("x")
    assert g.admit(refused) is Admission.REFUSE
    assert g.admit(dropped) is Admission.DROP and g.open == 3  # a dropped one is not counted
    assert not any(x.evicted for x in busy) and (g.refused, g.dropped) == (1, 1)
    for x in (*busy, refused, dropped, refused):
        g.release(x)
    assert g.open == 0
    assert g.admit(Conn("later")) is Admission.SERVE  # recovered


def test_a_burst_of_new_connections_is_refused_with_503_never_evicted_unanswered():
    clock = Clock()
    g = guard(4, 4 + BURST_ROOM, clock)
    burst = [Conn(str(i)) for i in range(64)]
    verdicts = []
    for x in burst:  # all at once: none has sent its headers yet
        verdicts.append(g.admit(x))
    assert verdicts == [Admission.SERVE] * 4 + [Admission.REFUSE] * 60
    assert not any(x.evicted for x in burst) and g.evicted == 0 and g.dropped == 0


def test_a_new_connection_silent_past_the_grace_is_a_slowloris_and_makes_room():
    clock = Clock()
    g = guard(2, 4, clock)
    slow, kept = Conn("slow"), Conn("kept")
    for x in (slow, kept):
        assert g.admit(x) is Admission.SERVE
    g.idle(kept)  # kept served a request: an idle keep-alive connection goes first, whatever its age
    assert g.admit(Conn("a")) is Admission.SERVE and kept.evicted and not slow.evicted
    b = Conn("b")
    assert g.admit(b) is Admission.REFUSE and not slow.evicted  # slow is still within its grace
    g.release(b)  # b closes after its 503
    clock.t += EVICT_GRACE_S
    assert g.admit(Conn("c")) is Admission.SERVE and slow.evicted


@pytest.mark.parametrize("soft, hard", [(BIG, BIG), (256, BIG), (256, 256), (64, 64)])
def test_cap_never_exceeds_the_ceiling(soft, hard):
    b = plan_budget(Settings(), soft, hard)
    assert 1 <= b.max_connections <= b.ceiling <= b.nofile


@pytest.mark.parametrize("name, value, words", [
    ("http_header_timeout", "0", "positive, finite"), ("http_header_timeout", "inf", "positive, finite"),
    ("http_body_timeout", "-1", "positive, finite"), ("http_body_timeout", "nan", "positive, finite"),
    ("max_connections", "0", "at least 1"), ("tokenizer_workers", "0", "at least 1"),
])
def test_http_settings_are_validated(name, value, words):
    with pytest.raises(SettingsError, match=words):
        resolve(argparse.Namespace(**{name: value}), environ={})


def test_http_settings_resolve_from_flags_and_environment():
    s = resolve(argparse.Namespace(http_header_timeout="2.5", max_connections="100"),
                environ={"PEGAINFER_TOKENIZER_WORKERS": "3", "PEGAINFER_HTTP_BODY_TIMEOUT": "12"})
    assert (s.http_header_timeout, s.http_body_timeout, s.max_connections, s.tokenizer_workers) == (2.5, 12.0, 100, 3)
