"""One EP process group as a rank sees it: the torch.distributed backend (gloo or NCCL) over the
rendezvous store, the expert-rank processes rank 0 spawned (if it spawned them), their liveness (the
heartbeat watch, ep/heartbeat.py), and waits that end within the rank timeout with a RankFailure that
names the rank.

The bounds rank 0 keeps, with T the rank timeout: a rank whose process ends is failed at the next
check (while idle: within IDLE_WAKE_S of the GPU thread) or at once in a wait; a rank that is alive
but silent is failed T after its last beat, idle or busy; a wait on a rank that beats but does not
answer ends after T. A failed group fails again at once on every later call."""
from __future__ import annotations

import dataclasses
import datetime
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import wait as wait_sentinels
from multiprocessing.process import BaseProcess
from typing import NoReturn

import torch
import torch.distributed as dist

from pegainfer.ep.backend import RankFailure
from pegainfer.ep.heartbeat import FRESH_S, RankWatch
from pegainfer.ep.rendezvous import ABANDONED_KEY

Work = dist.Work
STOP_GRACE_S = 5.0  # how long close() lets expert ranks exit on their own before terminating them
NCCL_WATCHDOG_MARGIN_S = 60.0  # NCCL's own timeout is the rank timeout plus this (see make_process_group)
# gloo takes a wait's timeout in whole milliseconds, so a wait that ran out may end this much before
# its deadline, and a silence measured then this much short of the rank timeout
WAIT_SLACK_S = 0.005


@dataclasses.dataclass(slots=True)
class Traffic:
    """Rank 0's collective calls and payload bytes since the last take()."""
    calls: int = 0
    sent: int = 0
    received: int = 0

    def take(self) -> Traffic:
        out = Traffic(self.calls, self.sent, self.received)
        self.calls = self.sent = self.received = 0
        return out


def make_process_group(store: dist.Store, rank: int, world_size: int, pg_backend: str,
                       timeout_s: float) -> dist.ProcessGroup:
    """The group's torch.distributed backend, built directly on the rendezvous store: no default
    (global) process group, so one process can hold, fail and drop several EP groups in turn."""
    prefixed = dist.PrefixStore("pg", store)
    timeout = datetime.timedelta(seconds=timeout_s)
    if pg_backend == "gloo":
        return dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    if pg_backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        # NCCL's watchdog ends the whole process when it fires; RankGroup.settle must always see a
        # stall first (and abort the communicator), so the watchdog only backstops it.
        opts._timeout = timeout + datetime.timedelta(seconds=NCCL_WATCHDOG_MARGIN_S)
        return dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
    raise ValueError(f"unknown process-group backend {pg_backend!r} (gloo or nccl)")


class RankGroup:
    """rank: this process's rank; procs: expert ranks this process spawned (rank 0 only, and only
    when it launched them itself); timeout_s: how long any wait may take before the rank is failed.

    NCCL work runs on GPU streams, so rank 0 never blocks the host in it: `finish` only orders the
    streams and `settle` polls completion against the deadline. Gloo work is host work: `finish`
    blocks, bounded by the group's own timeout."""

    def __init__(self, rank: int, world_size: int, store: dist.Store, pg: dist.ProcessGroup | None, pg_backend: str,
                 timeout_s: float, *, procs: dict[int, BaseProcess] | None = None, watch: RankWatch | None = None):
        self.rank = rank
        self.world_size = world_size
        self.store = store
        self.pg = pg
        self.pg_backend = pg_backend
        self.timeout_s = timeout_s
        self.procs = procs or {}
        self.watch = watch  # rank 0: the expert ranks' heartbeats (None on an expert rank)
        self.traffic = Traffic()
        self.failure: RankFailure | None = None
        self.closed = False
        self._pending: list[tuple[list[Work], list[int], str]] = []

    # ---- operations (each returns its Work; bytes are counted as rank 0 sees them) -------------
    def send(self, t: torch.Tensor, dst: int, tag: int) -> Work:
        self._count(sent=t.numel() * t.element_size())
        return self._issue([dst], f"send to rank {dst}", lambda: self.pg.send([t], dst, tag))

    def recv(self, t: torch.Tensor, src: int, tag: int) -> Work:
        self._count(received=t.numel() * t.element_size())
        return self._issue([src], f"receive from rank {src}", lambda: self.pg.recv([t], src, tag))

    def broadcast(self, t: torch.Tensor, root: int = 0) -> Work:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        nbytes = t.numel() * t.element_size() * (self.world_size - 1)
        self._count(sent=nbytes if self.rank == root else 0, received=0 if self.rank == root else nbytes)
        return self._issue(self._others(), "broadcast", lambda: self.pg.broadcast([t], opts))

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> Work:
        """Rows of `inp` go to ranks in in_splits order; rows from each rank land in `out` in
        out_splits order (splits along dim 0; a rank's own share must match on both sides)."""
        row = max(inp[0].numel() * inp.element_size() if inp.shape[0] else 0,
                  out[0].numel() * out.element_size() if out.shape[0] else 0)
        self._count(sent=(sum(in_splits) - in_splits[self.rank]) * row,
                    received=(sum(out_splits) - out_splits[self.rank]) * row)
        return self._issue(self._others(), "all-to-all",
                           lambda: self.pg.alltoall_base(out, inp, out_splits, in_splits, dist.AllToAllOptions()))

    def _issue(self, peers: list[int], what: str, op: Callable[[], Work]) -> Work:
        self.check()
        try:
            return op()
        except RuntimeError as e:  # a transport refusing new work (peer gone) fails the group too
            if self.rank != 0:
                raise
            self.fail(peers, what, e)

    def _others(self) -> list[int]:
        return [r for r in range(self.world_size) if r != self.rank]

    def _count(self, sent: int = 0, received: int = 0) -> None:
        self.traffic.calls += 1
        self.traffic.sent += sent
        self.traffic.received += received

    # ---- bounded waits --------------------------------------------------------------------------
    def check(self) -> None:
        """Raise the group's failure, if it has one (a failed group stays failed), or fail it now for
        a rank whose connection closed. Cheap: it runs before every operation."""
        if self.failure is not None:
            raise self.failure
        if self.closed:
            raise RankFailure("the EP group is closed")
        if self.watch is not None and self.watch.lost:
            self._fail_now(self._loss(), "")

    def check_liveness(self, during: str) -> None:
        """check(), and fail a rank that has been silent for the rank timeout too; `during` ends the
        message ("while idle")."""
        if self.watch is not None and self.failure is None and not self.closed:
            if self.watch.lost:
                self._fail_now(self._loss(), during)
            if self.watch.silent(self.timeout_s):
                self._fail_now(self._silence(), during)
        self.check()

    def finish(self, works: list[Work], peers: list[int], what: str) -> None:
        """Complete `works` (that involve `peers`), or fail the group naming the rank."""
        if self.pg_backend == "nccl":
            for w in works:
                w.wait()  # the current stream waits for the NCCL stream; the host does not block
            self._pending.append((works, peers, what))
            return
        budget = self.timeout_s if self.watch is None else self.watch.budget(peers, self.timeout_s)
        deadline = time.monotonic() + budget
        try:
            for w in works:
                # gloo: a dead peer's closed socket ends this at once; a silent one, the deadline
                # (a timeout of 0 would mean the group's own, so never pass less than a millisecond)
                w.wait(datetime.timedelta(seconds=max(1e-3, deadline - time.monotonic())))
        except RuntimeError as e:
            self.fail(peers, what, e, waited_s=budget if time.monotonic() >= deadline - WAIT_SLACK_S else None)

    def settle(self) -> None:
        """NCCL: wait, polling against the deadline, the expert processes' liveness and their
        heartbeats, until every finished() work is complete. Gloo: nothing is pending."""
        start = time.monotonic()
        deadline = start + self.timeout_s
        pause = 1e-5
        while self._pending:
            works, peers, what = self._pending[0]
            if all(w.is_completed() for w in works):
                self._pending.pop(0)
                continue
            now = time.monotonic()
            if self._exited() or now >= deadline or (self.watch is not None and (
                    self.watch.lost or self.watch.silent(self.timeout_s))):
                self.fail(peers, what, None, waited_s=now - start)
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def fail(self, peers: list[int], what: str, cause: BaseException | None, waited_s: float | None = None) -> NoReturn:
        """Record and raise the RankFailure: the exited or lost ranks if any, else the silent peers.
        waited_s: how long the wait ran before it gave up (None: it ended early, on an error). A
        closed connection fails a wait a moment before the exit status exists, so then it waits a
        little for the status, to name the signal."""
        exited = self._exited(grace_s=1.0 if waited_s is None else 0.0, among=peers)
        if exited:
            msg = "; ".join(f"expert rank {r} exited ({_describe_exit(code)})" for r, code in exited)
            msg += f" during {what}"
        elif self.watch is not None and self.watch.lost:
            msg = f"{self._loss()} during {what}"
        elif (waited_s is not None and waited_s < self.timeout_s
              and self.watch.silent(self.timeout_s - WAIT_SLACK_S)):
            # silent since before the wait: its budget was cut
            msg = f"{self._silence(self.timeout_s - WAIT_SLACK_S)} during {what}"
        else:
            names = ", ".join(str(p) for p in peers) or "?"
            msg = f"expert rank(s) {names} did not complete {what} within {self.timeout_s:g} s"
            if self.watch is not None and self.watch.silent(FRESH_S):
                msg += f"; {self._silence(FRESH_S)}"
        if cause is not None:
            msg += f" [{str(cause).splitlines()[0][:200]}]"
        self._fail_now(msg, "")

    def _fail_now(self, message: str, during: str) -> NoReturn:
        self.failure = RankFailure(f"{message} {during}".rstrip())
        self._pending.clear()
        self._abort()
        raise self.failure

    def _loss(self) -> str:
        """The ranks the watch lost: how each exited where this process spawned it (waiting a moment
        for the exit status), else that its connection closed."""
        exited = dict(self._exited(grace_s=1.0, among=list(self.watch.lost)))
        return "; ".join(f"expert rank {r} exited ({_describe_exit(exited[r])})" if r in exited else
                         f"expert rank {r} closed its connection (its process ended or its host is unreachable)"
                         for r in sorted(self.watch.lost))

    def _silence(self, at_least_s: float | None = None) -> str:
        silent = self.watch.silent(self.timeout_s if at_least_s is None else at_least_s)
        return "; ".join(f"expert rank {r} sent no heartbeat for {s:.1f} s (stopped or hung)" for r, s in silent)

    def _exited(self, grace_s: float = 0.0, among: list[int] | None = None) -> list[tuple[int, int]]:
        """(rank, exit code) of spawned ranks that have exited, waiting up to grace_s for one of
        `among` (default: all of them) to."""
        live = [p for r, p in self.procs.items() if p.exitcode is None and (among is None or r in among)]
        if grace_s > 0 and live:
            ready = set(wait_sentinels([p.sentinel for p in live], timeout=grace_s))
            for p in live:
                if p.sentinel in ready:
                    p.join(1.0)  # the sentinel pipe closes a moment before the exit status exists
        return [(r, p.exitcode) for r, p in sorted(self.procs.items()) if p.exitcode is not None]

    def _abort(self) -> None:
        if self.pg_backend == "nccl" and self.pg is not None:
            try:
                self.pg.abort()  # a hung NCCL kernel must not keep the GPU (or close()) waiting
            except RuntimeError:
                pass

    # ---- shutdown -------------------------------------------------------------------------------
    def close(self, send_stop: Callable[[], None] | None = None) -> None:
        """Stop the expert ranks: `send_stop()` (the backend's shutdown message) when the group is
        healthy, then join with a grace period, then terminate, then kill. Idempotent."""
        if self.closed:
            return
        if self.watch is not None:
            self.watch.close()  # the ranks are about to exit: their closed connections are no loss
        if self.failure is None and send_stop is not None and self.pg is not None:
            try:
                send_stop()
            except (RuntimeError, RankFailure):
                pass
        self.closed = True
        # A healthy rank exits on the stop message; after a failure none was sent: terminate at once.
        deadline = time.monotonic() + (STOP_GRACE_S if self.failure is None else 0.0)
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
        for sig in ("terminate", "kill"):  # SIGTERM, then SIGKILL for a rank that ignores or cannot take it
            for p in self.procs.values():
                if p.exitcode is None:
                    getattr(p, sig)()
            deadline = time.monotonic() + 1.0
            for p in self.procs.values():
                p.join(max(0.0, deadline - time.monotonic()))
        if self.failure is not None and self.store is not None:
            try:  # no stop message reached the survivors: this tells the ones rank 0 did not spawn
                self.store.set(ABANDONED_KEY, str(self.failure))
            except RuntimeError:
                pass
        self.store = None
        if self.pg is None:
            return
        if self.failure is not None:
            self._abort()
        elif self.pg_backend == "nccl":
            try:
                self.pg.shutdown()
            except RuntimeError:
                pass
        self.pg = None  # dropping the backend closes its connections: remote expert ranks see EOF


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
