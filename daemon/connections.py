"""The HTTP connection budget and the guard that keeps to it.

The budget: how many connections the daemon serves at once (--max-connections, by default twice
the queue it can hold plus room for probes) and the descriptor ceiling past which a connection is
closed unanswered, both within the process's descriptor limit (RLIMIT_NOFILE). At start-up the
soft limit is raised toward the hard one as far as the budget needs (as Go's runtime and nginx
do), and a structured warning names the limit when even the hard one is too low.

The guard, shared by every connection (daemon/http_protocol.py): at the cap a new connection
evicts the connection that has waited longest without a request in progress: an idle keep-alive one
first (as nginx reuses keep-alive connections), else one still sending its first request's headers
after EVICT_GRACE_S (a slowloris). A connection that opened less than EVICT_GRACE_S ago is never
evicted: in a burst of new connections its request is on the way, and closing it unanswered is a
reset to its client. With nothing to evict, the new connection's request gets a JSON 503 (counted
as a refusal); past the ceiling it is closed at once, so that the process never runs out of
descriptors (accept failing with EMFILE). The ceiling leaves BURST_ROOM descriptors above the cap
wherever the hard limit allows, so that a burst is answered rather than dropped."""
from __future__ import annotations

import dataclasses
import enum
import resource
import time
from typing import Protocol

from pegainfer.daemon.settings import Settings
from pegainfer.engine.kv_capacity import CPU_DEFAULT_SLOTS, MAX_AUTO_SLOTS
from pegainfer.engine.startup_log import log_event

# Descriptors kept for everything but client sockets: stdio, the listening socket, the trace file,
# epoll and thread wake-up pipes, checkpoint files while loading, device nodes. Measured on the CPU
# box once serving: 14 open descriptors with the local backend, 35 with host-staged at ep 2.
RESERVE_FDS = 128
RESERVE_FDS_PER_RANK = 32  # pipes and gloo/NCCL sockets to each expert rank, with room to spare
PROBE_MARGIN = 64  # health checks, metrics scrapes, cancel calls beside the queue's own connections
LOG_EVERY_S = 10.0  # at most one connection_cap log line per this many seconds
# A new connection gets this long to send its first request's headers before it may be evicted to
# make room (a burst's requests arrive within it; a slowloris is still sending after it)
EVICT_GRACE_S = 2.0
# Descriptors the ceiling keeps above the cap, when the hard limit allows: over-cap connections of a
# burst are answered with a 503 instead of being closed unanswered
BURST_ROOM = 4096


@dataclasses.dataclass(frozen=True, slots=True)
class ConnectionBudget:
    max_connections: int  # served normally
    ceiling: int  # past it a new connection is closed unanswered
    wanted: int  # what the settings ask for (--max-connections or the queue-derived default)
    nofile: int  # the soft descriptor limit in force
    nofile_hard: int

    @property
    def too_low(self) -> bool:
        return self.max_connections < self.wanted


def wanted_connections(s: Settings) -> int:
    if s.max_connections is not None:
        return s.max_connections
    # --max-active left to the engine: as many as it may choose
    active = s.max_active or (CPU_DEFAULT_SLOTS if s.device == "cpu" else MAX_AUTO_SLOTS)
    # Each queued request holds a connection, and a client pool may keep as many idle ones.
    return 2 * (active + s.max_pending) + PROBE_MARGIN


def plan_budget(s: Settings, soft: int, hard: int) -> ConnectionBudget:
    """The budget under descriptor limits (soft, hard), with the soft limit it wants set; pure."""
    wanted = wanted_connections(s)
    reserve = RESERVE_FDS + RESERVE_FDS_PER_RANK * s.ep_size
    need = reserve + wanted + max(wanted // 4, BURST_ROOM)  # above the cap: 503s instead of closing unanswered
    if soft != resource.RLIM_INFINITY and soft < need:
        soft = need if hard == resource.RLIM_INFINITY else min(hard, need)
    usable = need if soft == resource.RLIM_INFINITY else soft
    room = max(2, usable - reserve)
    return ConnectionBudget(max(1, min(wanted, room * 4 // 5)), room, wanted, soft, hard)


def apply_budget(s: Settings) -> ConnectionBudget:
    """Read the descriptor limits, raise the soft one as far as needed and allowed, log the budget
    (and a warning when the limit is too low for the configured queue)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    budget = plan_budget(s, soft, hard)
    if budget.nofile != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (budget.nofile, hard))
        except (ValueError, OSError) as e:
            log_event("descriptor_limit_not_raised", nofile=soft, wanted=budget.nofile, error=str(e))
            budget = plan_budget(s, soft, soft)
    log_event("http_limits", max_connections=budget.max_connections, connection_ceiling=budget.ceiling,
              nofile=budget.nofile, header_timeout_s=s.http_header_timeout, body_timeout_s=s.http_body_timeout,
              tokenizer_workers=s.tokenizer_workers)
    if budget.too_low:
        log_event("descriptor_limit_low", level="warning", nofile=budget.nofile, nofile_hard=budget.nofile_hard,
                  wanted_connections=budget.wanted, max_connections=budget.max_connections,
                  max_pending=s.max_pending, max_active=s.max_active,
                  hint="raise the descriptor limit (LimitNOFILE= in the systemd unit, or ulimit -n) or lower "
                       "--max-pending / --max-active / --max-connections")
    return budget


class Evictable(Protocol):
    def evict(self) -> None: ...


class Admission(enum.Enum):
    SERVE = "serve"
    REFUSE = "refuse"  # answered with a JSON 503 once its headers arrive
    DROP = "drop"  # closed at once


class ConnectionGuard:
    """Open connections against the budget; which may be evicted (oldest first)."""

    def __init__(self, budget: ConnectionBudget, clock=time.monotonic):
        self.budget = budget
        self._served: set[Evictable] = set()  # served normally: at most max_connections
        self._refusing: set[Evictable] = set()  # over the cap, being answered 503: up to the ceiling in all
        self._kept: dict[Evictable, None] = {}  # idle after a response, longest-waiting first
        self._fresh: dict[Evictable, float] = {}  # opened, first headers not complete: when it opened
        self.evicted = self.refused = self.dropped = 0
        self._clock = clock
        self._logged_at = -LOG_EVERY_S
        self._logged = (0, 0, 0)

    @property
    def open(self) -> int:
        return len(self._served) + len(self._refusing)

    def admit(self, conn: Evictable) -> Admission:
        if len(self._served) >= self.budget.max_connections and (victim := self._victim()) is not None:
            self.release(victim)  # its descriptor is freed as it closes: count it out now
            victim.evict()
            self.evicted += 1
        if len(self._served) < self.budget.max_connections:
            self._served.add(conn)
            self._fresh[conn] = self._clock()  # no request yet: the grace to send its first one starts
            verdict = Admission.SERVE
        elif self.open < self.budget.ceiling:
            self._refusing.add(conn)
            verdict, self.refused = Admission.REFUSE, self.refused + 1
        else:
            verdict, self.dropped = Admission.DROP, self.dropped + 1
        self._log()
        return verdict

    def _victim(self) -> Evictable | None:
        """The idle keep-alive connection that waited longest, else the oldest new connection still
        without its headers once it has had EVICT_GRACE_S to send them, else none."""
        if self._kept:
            return next(iter(self._kept))
        if self._fresh:
            conn, opened = next(iter(self._fresh.items()))
            if self._clock() - opened >= EVICT_GRACE_S:
                return conn
        return None

    def idle(self, conn: Evictable) -> None:
        """`conn` has no request in progress: its last response is complete."""
        if conn in self._served:
            self._fresh.pop(conn, None)
            self._kept.pop(conn, None)
            self._kept[conn] = None  # to the back: it has waited least

    def busy(self, conn: Evictable) -> None:
        self._fresh.pop(conn, None)
        self._kept.pop(conn, None)

    def release(self, conn: Evictable) -> None:
        """`conn` closed (or is closing): idempotent."""
        self.busy(conn)
        self._served.discard(conn)
        self._refusing.discard(conn)

    def _log(self) -> None:
        counts = (self.evicted, self.refused, self.dropped)
        now = self._clock()
        if counts == self._logged or now - self._logged_at < LOG_EVERY_S:
            return
        before, self._logged, self._logged_at = self._logged, counts, now
        log_event("connection_cap", open=self.open, max_connections=self.budget.max_connections,
                  ceiling=self.budget.ceiling, evicted=counts[0] - before[0], refused=counts[1] - before[1],
                  dropped=counts[2] - before[2])
