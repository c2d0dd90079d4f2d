"""Random event sequences against the scheduler: whatever the mix of submits, cancels,
disconnects, engine events, failures and drains, no slot leaks, admission stays FCFS, and every
request ends in exactly one terminal state with exactly one terminal sink item."""
from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pegainfer.lifecycle.rejection import Draining, NotReady, QueueFull, Rejection
from pegainfer.lifecycle.request import Request
from pegainfer.lifecycle.scheduler import Scheduler
from pegainfer.lifecycle.states import ENGINE_HELD, TERMINAL, RequestState

from tests.lifecycle.fakes import FakeClock, FakeEngine, RecordingObserver, drain_sink, make_request, tok

MAX_ACTIVE = 2
MAX_PENDING = 2
S = RequestState


def _rid(index: int) -> str:
    return f"r{index}"


def _index(request_id: str) -> int:
    return int(request_id[1:])


# a pick names one of the submitted requests, or (one time in len+1) an id nobody submitted
picks = st.integers(min_value=0, max_value=63)


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.engine = FakeEngine()
        self.clock = FakeClock()
        self.observer = RecordingObserver()
        self.scheduler = Scheduler(self.engine, max_active=MAX_ACTIVE, max_pending=MAX_PENDING,
                                   clock=self.clock, observer=self.observer)
        self.scheduler.set_ready(True)
        self.requests: dict[str, Request] = {}
        self.terminal_seen: dict[str, RequestState] = {}
        self.ends_read: Counter[str] = Counter()
        self.tokens_read: dict[str, list[int]] = {}

    def _pick(self, pick: int) -> str:
        return _rid(pick % (len(self.requests) + 1))

    # ---- the request side ------------------------------------------------------------------------
    @rule(bounds=st.lists(st.integers(1, 3), min_size=1, max_size=3))
    def submit(self, bounds: list[int]) -> None:
        """A burst of submits, each with its own sink bound (small, so slow readers happen)."""
        for max_buffered in bounds:
            self._submit_one(max_buffered)

    def _submit_one(self, max_buffered: int) -> None:
        rid = _rid(len(self.requests))
        request = make_request(rid, max_buffered=max_buffered)
        self.requests[rid] = request
        self.tokens_read[rid] = []
        running, waiting = self.scheduler.num_running, self.scheduler.num_waiting
        ready, draining = self.scheduler.ready, self.scheduler.draining
        try:
            self.scheduler.submit(request)
        except Rejection as rejection:
            assert request.state is S.REJECTED
            if draining:
                assert isinstance(rejection, Draining)
            elif not ready:
                assert isinstance(rejection, NotReady)
            else:
                assert isinstance(rejection, QueueFull)
                assert running == MAX_ACTIVE and waiting == MAX_PENDING
            return
        assert ready and not draining
        if waiting == 0 and running < MAX_ACTIVE:
            assert request.state is S.ADMITTED
        else:
            assert request.state is S.PENDING

    @rule(pick=picks)
    def cancel(self, pick: int) -> None:
        rid = self._pick(pick)
        live = rid in self.requests and not self.requests[rid].is_terminal
        assert self.scheduler.cancel(rid) == live

    @rule(pick=picks)
    def disconnect(self, pick: int) -> None:
        rid = self._pick(pick)
        live = rid in self.requests and not self.requests[rid].is_terminal
        assert self.scheduler.disconnect(rid) == live

    @rule(pick=picks)
    def read(self, pick: int) -> None:
        rid = self._pick(pick)
        if rid in self.requests:
            tokens, ends = drain_sink(self.requests[rid])
            self.tokens_read[rid].extend(tokens)
            self.ends_read[rid] += len(ends)

    @precondition(lambda self: len(self.requests) >= 6)
    @rule()
    def start_drain(self) -> None:
        self.scheduler.start_drain()

    # ---- the engine side: events for requests it was given, or for ids it never knew ---------------
    def _engine_may_speak_of(self, rid: str) -> bool:
        request = self.requests.get(rid)
        return request is None or request.state is not S.PENDING

    @rule(pick=picks)
    def prefill_started(self, pick: int) -> None:
        rid = self._pick(pick)
        if self._engine_may_speak_of(rid):
            self.scheduler.on_prefill_started(rid)

    @rule(pick=picks, token=st.integers(0, 102399), batch=st.integers(1, 8))
    def token(self, pick: int, token: int, batch: int) -> None:
        rid = self._pick(pick)
        if self._engine_may_speak_of(rid):
            self.scheduler.on_token(tok(rid, token), batch)

    @rule(pick=picks, reason=st.sampled_from(["stop", "length"]))
    def finished(self, pick: int, reason: str) -> None:
        rid = self._pick(pick)
        if self._engine_may_speak_of(rid):
            self.scheduler.on_finished(rid, reason)

    @rule(finishing=st.sets(st.integers(0, MAX_ACTIVE - 1)), reason=st.sampled_from(["stop", "length"]))
    def engine_step(self, finishing: set[int], reason: str) -> None:
        """One decode step as the engine reports it: a token for every request it holds, then
        finished events for some of them."""
        held = [r.request_id for r in self.requests.values() if r.state in ENGINE_HELD]
        for rid in held:
            self.scheduler.on_token(tok(rid, len(self.requests[rid].output_ids)), len(held))
        for slot in sorted(finishing):
            if slot < len(held):
                self.scheduler.on_finished(held[slot], reason)

    @rule(pick=picks)
    def failed(self, pick: int) -> None:
        rid = self._pick(pick)
        self.scheduler.on_failed(rid, "engine error")

    @precondition(lambda self: self.scheduler.num_running == MAX_ACTIVE)
    @rule()
    def fail_all(self) -> None:
        admitted = list(self.engine.admitted)
        self.scheduler.fail_all("rank died")
        assert self.scheduler.num_running == self.scheduler.num_waiting == 0
        assert self.engine.admitted == admitted  # nothing was handed to the dead engine

    @rule()
    def engine_restarted(self) -> None:
        self.scheduler.set_ready(True)

    @rule()
    def tick(self) -> None:
        self.clock.tick(0.5)

    # ---- what must hold after every step ---------------------------------------------------------
    @invariant()
    def slots_match_states(self) -> None:
        held = [r for r in self.requests.values() if r.state in ENGINE_HELD]
        queued = [r for r in self.requests.values() if r.state is S.PENDING]
        live = [r for r in self.requests.values() if not r.is_terminal]
        assert self.scheduler.num_running == len(held) <= MAX_ACTIVE
        assert self.scheduler.num_waiting == len(queued) <= MAX_PENDING
        assert self.scheduler.num_running + self.scheduler.num_waiting == len(live)
        assert not queued or len(held) == MAX_ACTIVE  # nobody waits while a slot is idle
        assert all(r.request_id not in self.engine.cancelled for r in held)
        # a slow reader never makes the server hold more than its bound
        assert all(r.sink.buffered <= r.sink.max_buffered for r in live)

    @invariant()
    def engine_is_told_to_drop_what_the_server_ended(self) -> None:
        cancelled = set(self.engine.cancelled)
        for rid in self.engine.admitted:
            state = self.requests[rid].state
            if state in (S.CANCELLED, S.DISCONNECTED):
                assert rid in cancelled
            elif state is S.FINISHED or not self.requests[rid].is_terminal:
                assert rid not in cancelled

    @invariant()
    def admission_is_fcfs(self) -> None:
        admitted = [_index(rid) for rid in self.engine.admitted]
        assert admitted == sorted(admitted)
        queued = [_index(r.request_id) for r in self.requests.values() if r.state is S.PENDING]
        assert not queued or not admitted or min(queued) > max(admitted)

    @invariant()
    def terminal_states_are_final_and_counted_once(self) -> None:
        terminal = 0
        for rid, request in self.requests.items():
            if request.is_terminal:
                terminal += 1
                assert self.terminal_seen.setdefault(rid, request.state) is request.state
                assert request.sink.closed and request.finished_at is not None
        moves = Counter(rid for rid, _, new in self.observer.moves if new in TERMINAL)
        assert all(count == 1 for count in moves.values()) and sum(moves.values()) == terminal
        snap = self.scheduler.snapshot()
        counted = sum(snap[k] for k in ("completed_stop", "completed_length", "rejected",
                                        "cancelled", "disconnected", "failed"))
        assert counted == terminal and snap["submitted"] == len(self.requests)

    def teardown(self) -> None:
        self.scheduler.cancel_all("test over")
        snap = self.scheduler.snapshot()
        assert (snap["running"], snap["waiting"]) == (0, 0)
        for rid, request in self.requests.items():
            assert request.is_terminal
            tokens, ends = drain_sink(request)
            self.tokens_read[rid].extend(tokens)
            assert self.ends_read[rid] + len(ends) == 1, f"{rid}: terminal items != 1"
            assert self.tokens_read[rid] == request.output_ids  # nothing lost, nothing invented


SchedulerMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None, database=None)
TestScheduler = SchedulerMachine.TestCase
