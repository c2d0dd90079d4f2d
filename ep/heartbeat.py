"""Expert-rank liveness, busy or idle: each expert rank sends rank 0 a small beat every HEARTBEAT_S
over a gloo group of its own, and rank 0 keeps one thread per rank blocked in the matching receive.

- A rank whose process ends (killed, crashed, exited) closes its connections: the receive fails at
  once, on any host, so rank 0 knows within milliseconds, whether it spawned the rank or the rank
  was started elsewhere with `pegainfer expert-worker`.
- A rank that is alive but silent (SIGSTOP, a hang, its host unreachable) sends no beat: rank 0
  counts it failed once it has been silent for the rank timeout.

The beats come from a thread of their own, not from the rank's serving loop, so a rank busy in a
long exchange (or blocked waiting for the next one) keeps beating, while a stopped process stops
every thread, which is what rank 0 must see. A group of their own keeps the beats out of the
steps' collectives (which on CUDA run on NCCL streams). Nothing here decides what a lost rank means
for the engine: RankGroup reads `lost` and `silent` and fails the group."""
from __future__ import annotations

import datetime
import threading
import time

import torch
import torch.distributed as dist

from pegainfer.ep.rendezvous import ABANDONED_KEY

HEARTBEAT_S = 0.1  # an expert rank's beat period
FRESH_S = 3 * HEARTBEAT_S  # a rank heard from within this is beating normally
ABANDON_CHECK_S = 2.0  # how often an expert rank asks the store whether rank 0 abandoned the group
BEAT_TIMEOUT_S = 30.0  # an expert rank whose beat rank 0 has not taken for this long counts rank 0 lost
TAG_BEAT = 7
_FOREVER = datetime.timedelta(days=7)


def make_liveness_group(store: dist.Store, rank: int, world_size: int, timeout_s: float) -> dist.ProcessGroup:
    """The beats' own gloo group on the rendezvous store (every rank builds it, right after the
    group the steps use)."""
    return dist.ProcessGroupGloo(dist.PrefixStore("live", store), rank, world_size,
                                 datetime.timedelta(seconds=timeout_s))


class RankWatch:
    """Rank 0's side: what it last heard from each expert rank, and which ones it lost. Read from
    any thread; written only by the listener threads."""

    def __init__(self, pg: dist.ProcessGroup, world_size: int):
        self.pg = pg
        now = time.monotonic()
        self.last_heard = {r: now for r in range(1, world_size)}  # rank -> monotonic time of its last beat
        self.lost: dict[int, str] = {}  # rank -> why its beats ended (its connection closed)
        self.closing = False
        for r in self.last_heard:
            threading.Thread(target=self._listen, args=(r,), name=f"pegainfer-rank-watch-{r}", daemon=True).start()

    @classmethod
    def start(cls, store: dist.Store, world_size: int, timeout_s: float) -> RankWatch:
        return cls(make_liveness_group(store, 0, world_size, timeout_s), world_size)

    def _listen(self, rank: int) -> None:
        beat = torch.zeros(1, dtype=torch.int64)
        while not self.closing:
            try:
                # No timeout of its own: only a closed connection ends this wait (a timed-out gloo
                # wait would close every pair of the group); silence is judged by `silent`.
                self.pg.recv([beat], rank, TAG_BEAT).wait(_FOREVER)
            except RuntimeError as e:
                if not self.closing:  # during close() the ranks are expected to go away
                    self.lost[rank] = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
                return
            self.last_heard[rank] = time.monotonic()

    def silence(self, rank: int, now: float | None = None) -> float:
        """Seconds since `rank` was last heard from."""
        return (time.monotonic() if now is None else now) - self.last_heard[rank]

    def silent(self, timeout_s: float) -> list[tuple[int, float]]:
        """(rank, seconds) of the ranks silent for timeout_s or longer, in rank order."""
        now = time.monotonic()
        if now - min(self.last_heard.values(), default=now) < timeout_s:  # the usual answer, cheaply
            return []
        return [(r, now - t) for r, t in sorted(self.last_heard.items()) if now - t >= timeout_s]

    def budget(self, peers: list[int], timeout_s: float) -> float:
        """How long a wait on `peers` may take: the rank timeout, less the silence of a peer that
        had already gone quiet before the wait (so that a rank stopped while the group was idle is
        failed the rank timeout after its last beat, not after the next request's first wait)."""
        now = time.monotonic()
        quiet = max((self.silence(p, now) for p in peers if p in self.last_heard), default=0.0)
        return timeout_s if quiet <= FRESH_S else max(0.0, timeout_s - quiet)

    def close(self) -> None:
        """From now on the ranks' connections may close: that is no longer a loss. The listener
        threads end as their ranks exit."""
        self.closing = True


def beat_until_lost(pg: dist.ProcessGroup, store: dist.Store, stopped: threading.Event) -> str | None:
    """An expert rank's beat loop (run it on a thread of its own): a beat to rank 0 every
    HEARTBEAT_S, until rank 0 is gone (a beat fails or is not taken within BEAT_TIMEOUT_S, or the
    store stops answering) or abandoned the group. Returns why; None when `stopped` was set first
    (the rank ended cleanly, and rank 0 may go away at any moment after)."""
    beat = torch.zeros(1, dtype=torch.int64)
    timeout = datetime.timedelta(seconds=BEAT_TIMEOUT_S)
    next_store_check = time.monotonic() + ABANDON_CHECK_S
    while not stopped.is_set():
        try:
            pg.send([beat], 0, TAG_BEAT).wait(timeout)
            if time.monotonic() >= next_store_check:
                next_store_check = time.monotonic() + ABANDON_CHECK_S
                if store.check([ABANDONED_KEY]):
                    return "rank 0 abandoned the group: " + store.get(ABANDONED_KEY).decode()
        except Exception as e:  # noqa: BLE001 - failing to reach rank 0 means it is gone
            return None if stopped.is_set() else str(e).splitlines()[0][:200]
        stopped.wait(HEARTBEAT_S)
    return None
