"""The scheduler against a recording fake engine: admission, FCFS, rejections, cancel versus
disconnect, slow readers, late events, engine failures, draining."""
from __future__ import annotations

import dataclasses

import pytest

from pegainfer.engine.contract import PromptLogprobs
from pegainfer.lifecycle.rejection import Draining, NotReady, QueueFull
from pegainfer.lifecycle.request import Request
from pegainfer.lifecycle.scheduler import SLOW_READER, Scheduler
from pegainfer.lifecycle.sink import SinkItem
from pegainfer.lifecycle.states import FinishReason, RequestState, TerminalReason

from tests.lifecycle.fakes import FakeClock, FakeEngine, RecordingObserver, drain_sink, make_request, tok

S = RequestState


@dataclasses.dataclass(slots=True)
class Rig:
    scheduler: Scheduler
    engine: FakeEngine
    clock: FakeClock
    observer: RecordingObserver

    def submit(self, request_id: str, **kwargs: int) -> Request:
        request = make_request(request_id, **kwargs)
        self.scheduler.submit(request)
        return request


def make_rig(max_active: int = 2, max_pending: int = 2) -> Rig:
    engine, clock, observer = FakeEngine(), FakeClock(), RecordingObserver()
    scheduler = Scheduler(engine, max_active=max_active, max_pending=max_pending, clock=clock,
                          observer=observer, retry_after_s=2.5)
    scheduler.set_ready(True)
    return Rig(scheduler, engine, clock, observer)


def assert_idle(rig: Rig) -> None:
    snap = rig.scheduler.snapshot()
    assert (snap["running"], snap["waiting"]) == (0, 0)
    assert rig.scheduler.num_running == rig.scheduler.num_waiting == 0


def test_admits_up_to_max_active_then_queues_then_refuses() -> None:
    rig = make_rig(max_active=2, max_pending=1)
    r0, r1, r2 = rig.submit("r0"), rig.submit("r1"), rig.submit("r2")
    assert [r.state for r in (r0, r1, r2)] == [S.ADMITTED, S.ADMITTED, S.PENDING]
    assert rig.engine.admitted == ["r0", "r1"]
    r3 = make_request("r3")
    with pytest.raises(QueueFull) as info:
        rig.scheduler.submit(r3)
    assert info.value.retry_after_s == 2.5
    assert r3.state is S.REJECTED and r3.terminal_reason is TerminalReason.REJECTED
    assert drain_sink(r3)[1][0].state is S.REJECTED
    assert rig.observer.path("r0") == [S.RECEIVED, S.PENDING, S.ADMITTED]
    assert rig.observer.path("r3") == [S.RECEIVED, S.REJECTED]
    snap = rig.scheduler.snapshot()
    assert (snap["running"], snap["waiting"], snap["submitted"], snap["rejected"]) == (2, 1, 4, 1)


def test_full_request_story_with_times_and_batch_facts() -> None:
    rig = make_rig(max_active=2)
    request = rig.submit("a", max_tokens=3)
    assert request.received_at == 100.0 and request.admitted_at == 100.0
    rig.clock.tick()
    rig.scheduler.on_prefill_started("a")
    rig.clock.tick()
    rig.scheduler.on_token(tok("a", 11), batch_size=4)  # the prefill's token: not a decode batch
    assert request.state is S.DECODE and request.decode_batch_size_max == 0
    rig.clock.tick()
    rig.scheduler.on_token(tok("a", 12), batch_size=2)
    rig.scheduler.on_token(tok("a", 13), batch_size=3)
    rig.scheduler.on_finished("a", "length")
    assert request.state is S.FINISHED and request.output_ids == [11, 12, 13]
    assert request.finish_reason is FinishReason.LENGTH
    assert request.terminal_reason is TerminalReason.COMPLETED_LENGTH
    assert (request.prefill_started_at, request.first_token_at, request.finished_at) == (
        101.0, 102.0, 103.0)
    assert request.decode_batch_size_max == 3 and request.active_set_size_max == 1
    item = request.sink.read_nowait()
    assert item is not None and [t.token_id for t in item.tokens] == [11, 12, 13]
    assert item.end is not None and item.end.finish_reason is FinishReason.LENGTH
    assert rig.observer.path("a") == [S.RECEIVED, S.PENDING, S.ADMITTED, S.PREFILL, S.DECODE,
                                      S.FINISHED]
    assert rig.scheduler.snapshot()["completed_length"] == 1
    assert_idle(rig)


def test_first_token_without_prefill_event_and_single_token_finish() -> None:
    rig = make_rig()
    request = rig.submit("one", max_tokens=1)
    rig.scheduler.on_token(tok("one", 7), batch_size=1)
    rig.scheduler.on_finished("one", FinishReason.STOP)
    assert rig.observer.path("one")[-4:] == [S.ADMITTED, S.PREFILL, S.DECODE, S.FINISHED]
    assert request.terminal_reason is TerminalReason.COMPLETED_STOP
    tokens, ends = drain_sink(request)
    assert tokens == [7] and len(ends) == 1


def test_freed_slots_admit_pending_requests_in_arrival_order() -> None:
    rig = make_rig(max_active=1, max_pending=3)
    first, *queued = [rig.submit(f"r{i}") for i in range(4)]
    assert [r.state for r in queued] == [S.PENDING] * 3
    rig.scheduler.cancel("r2")  # leaves the queue without ever reaching the engine
    rig.scheduler.on_token(tok("r0", 1), batch_size=1)
    rig.scheduler.on_finished("r0", "stop")
    assert queued[0].state is S.ADMITTED and queued[0].pending_depth_at_admit == 1
    rig.scheduler.disconnect("r1")
    assert queued[2].state is S.ADMITTED and queued[2].pending_depth_at_admit == 0
    assert rig.engine.admitted == ["r0", "r1", "r3"]
    assert first.state is S.FINISHED


def test_active_set_size_max_is_tracked_for_every_running_request() -> None:
    rig = make_rig(max_active=3)
    a = rig.submit("a")
    b = rig.submit("b")
    rig.scheduler.cancel("a")
    c = rig.submit("c")
    d = rig.submit("d")
    assert (a.active_set_size_max, b.active_set_size_max, c.active_set_size_max,
            d.active_set_size_max) == (2, 3, 3, 3)


def test_cancel_and_disconnect_are_told_apart() -> None:
    rig = make_rig(max_active=2, max_pending=2)
    for rid in ("run-c", "run-d", "wait-c", "wait-d"):
        rig.submit(rid)
    assert rig.scheduler.cancel("wait-c") and rig.scheduler.disconnect("wait-d")
    assert rig.engine.cancelled == []  # the engine never held the queued ones
    assert rig.scheduler.cancel("run-c", "cancelled by API")
    assert rig.scheduler.disconnect("run-d")
    assert rig.engine.cancelled == ["run-c", "run-d"]
    reqs = {rid: rig.observer.path(rid)[-1] for rid in ("run-c", "run-d", "wait-c", "wait-d")}
    assert reqs == {"run-c": S.CANCELLED, "run-d": S.DISCONNECTED,
                    "wait-c": S.CANCELLED, "wait-d": S.DISCONNECTED}
    snap = rig.scheduler.snapshot()
    assert (snap["cancelled"], snap["disconnected"]) == (2, 2)
    assert not rig.scheduler.cancel("run-c") and not rig.scheduler.disconnect("nope")
    assert_idle(rig)


def test_a_slow_reader_gets_its_request_cancelled_and_frees_the_slot() -> None:
    rig = make_rig(max_active=1, max_pending=1)
    slow = rig.submit("slow", max_tokens=100, max_buffered=3)
    waiting = rig.submit("next")
    rig.scheduler.on_token(tok("slow", 0), batch_size=1)
    assert slow.sink.read_nowait() == SinkItem([tok("slow", 0)])  # a read keeps it under the bound
    for token in range(1, 4):
        rig.scheduler.on_token(tok("slow", token), batch_size=1)
    assert slow.state is S.DECODE
    rig.scheduler.on_token(tok("slow", 4), batch_size=1)  # four unread tokens > max_buffered
    assert slow.state is S.CANCELLED and slow.error == SLOW_READER
    assert rig.engine.cancelled == ["slow"] and waiting.state is S.ADMITTED
    tokens, ends = drain_sink(slow)
    assert tokens == [1, 2, 3, 4] and [e.message for e in ends] == [SLOW_READER]
    rig.scheduler.on_token(tok("slow", 5), batch_size=1)  # already in flight when the cancel went
    assert rig.scheduler.late_events == 1


def test_late_and_unknown_engine_events_are_counted_and_ignored() -> None:
    rig = make_rig()
    request = rig.submit("gone")
    rig.scheduler.cancel("gone")
    rig.scheduler.on_prefill_started("gone")
    rig.scheduler.on_token(tok("gone", 1), batch_size=1)
    rig.scheduler.on_finished("gone", "stop")
    rig.scheduler.on_failed("gone", "boom")
    rig.scheduler.on_token(tok("never-seen", 1), batch_size=1)
    assert rig.scheduler.late_events == 5 and rig.scheduler.counters.protocol_errors == 0
    assert request.state is S.CANCELLED and request.output_ids == []
    assert len(drain_sink(request)[1]) == 1


@pytest.mark.parametrize("event", ["finish-before-token", "token-for-queued", "double-prefill"])
def test_engine_protocol_errors_fail_the_request_instead_of_leaking_it(event: str) -> None:
    rig = make_rig(max_active=1, max_pending=1)
    held = rig.submit("held")
    queued = rig.submit("queued")
    victim = held
    if event == "finish-before-token":
        rig.scheduler.on_finished("held", "stop")
    elif event == "token-for-queued":
        rig.scheduler.on_token(tok("queued", 3), batch_size=1)
        victim = queued
    else:
        rig.scheduler.on_prefill_started("held")
        rig.scheduler.on_prefill_started("held")
    assert victim.state is S.FAILED and "protocol error" in (victim.error or "")
    assert rig.scheduler.counters.protocol_errors == 1
    assert rig.engine.cancelled == (["held"] if victim is held else [])
    assert rig.scheduler.num_running == 1  # the slot went straight to the next request


def test_one_failure_and_then_the_whole_engine_failing() -> None:
    rig = make_rig(max_active=2, max_pending=2)
    reqs = [rig.submit(f"r{i}") for i in range(4)]
    rig.scheduler.on_failed("r0", "bad sample")
    assert reqs[0].state is S.FAILED and reqs[0].error == "bad sample"
    assert rig.engine.admitted == ["r0", "r1", "r2"]
    assert rig.scheduler.fail_all("rank 1 died") == 3
    assert [r.state for r in reqs] == [S.FAILED] * 4
    assert rig.engine.admitted == ["r0", "r1", "r2"]  # r3 went down with the queue, not admitted
    assert not rig.scheduler.ready and rig.scheduler.snapshot()["failed"] == 4
    assert all(len(drain_sink(r)[1]) == 1 for r in reqs)
    assert_idle(rig)
    with pytest.raises(NotReady, match=r"^server not ready: rank 1 died$"):  # the refusal says why
        rig.scheduler.submit(make_request("after"))
    rig.scheduler.set_ready(True)  # a new engine: the old reason is gone
    rig.scheduler.set_ready(False)
    with pytest.raises(NotReady, match=r"^server not ready$"):
        rig.scheduler.submit(make_request("later"))


def test_not_ready_until_told_otherwise() -> None:
    scheduler = Scheduler(FakeEngine(), max_active=1, max_pending=0)
    request = make_request("early")
    with pytest.raises(NotReady):
        scheduler.submit(request)
    assert request.state is S.REJECTED and request.received_at is not None
    scheduler.set_ready(True)
    scheduler.submit(make_request("late"))
    assert scheduler.num_running == 1
    with pytest.raises(QueueFull):  # max_pending=0: no queue at all
        scheduler.submit(make_request("extra"))


async def test_draining_refuses_new_work_and_finishes_the_accepted_work() -> None:
    rig = make_rig(max_active=1, max_pending=1)
    rig.submit("a")
    queued = rig.submit("b")
    rig.scheduler.start_drain()
    with pytest.raises(Draining):
        rig.submit("c")
    assert await rig.scheduler.wait_idle(timeout=0.01) is False
    rig.scheduler.on_token(tok("a", 1), batch_size=1)
    rig.scheduler.on_finished("a", "stop")
    assert queued.state is S.ADMITTED  # accepted work still runs while draining
    rig.scheduler.on_token(tok("b", 1), batch_size=1)
    rig.scheduler.on_finished("b", "length")
    assert await rig.scheduler.wait_idle(timeout=1.0) is True
    assert rig.scheduler.snapshot()["draining"] is True


async def test_cancel_all_ends_the_grace_period_without_admitting_the_queue() -> None:
    rig = make_rig(max_active=2, max_pending=2)
    reqs = [rig.submit(f"r{i}") for i in range(4)]
    rig.scheduler.start_drain()
    assert rig.scheduler.cancel_all("server shutting down") == 4
    assert rig.engine.admitted == ["r0", "r1"] and sorted(rig.engine.cancelled) == ["r0", "r1"]
    assert all(r.state is S.CANCELLED and r.error == "server shutting down" for r in reqs)
    assert await rig.scheduler.wait_idle(timeout=0) is True


def test_daemon_side_rejection_and_duplicate_ids() -> None:
    rig = make_rig()
    live = rig.submit("dup")
    invalid = make_request("dup")
    rig.scheduler.reject(invalid, "prompt longer than the context")
    assert invalid.state is S.REJECTED and invalid.error == "prompt longer than the context"
    assert live.state is S.ADMITTED and rig.scheduler.num_running == 1  # not freed by the twin
    with pytest.raises(ValueError):
        rig.scheduler.submit(make_request("dup"))
    assert rig.scheduler.get("dup") is live and rig.scheduler.get("other") is None


def test_observer_sees_terminal_fields_already_set() -> None:
    seen: list[tuple[TerminalReason | None, float | None, bool]] = []

    class Peek:
        def on_transition(self, request: Request, old: RequestState, new: RequestState) -> None:
            if new.is_terminal:
                seen.append((request.terminal_reason, request.finished_at, request.sink.closed))

    scheduler = Scheduler(FakeEngine(), max_active=1, max_pending=0, clock=FakeClock(),
                          observer=Peek())
    scheduler.set_ready(True)
    scheduler.submit(make_request("x"))
    scheduler.disconnect("x")
    assert seen == [(TerminalReason.DISCONNECTED, 100.0, False)]


@pytest.mark.parametrize(("active", "pending"), [(0, 1), (1, -1)])
def test_constructor_refuses_nonsense_bounds(active: int, pending: int) -> None:
    with pytest.raises(ValueError):
        Scheduler(FakeEngine(), max_active=active, max_pending=pending)


def test_a_stop_string_finishes_its_choice_through_the_engine_client() -> None:
    rig = make_rig(max_active=1, max_pending=1)
    rig.submit("a")
    queued = rig.submit("q")
    rig.scheduler.on_token(tok("a", 5, index=1), batch_size=1)
    assert rig.scheduler.stop_choice("a", 1) and rig.engine.stopped == [("a", 1)]
    assert not rig.scheduler.stop_choice("a", 1)  # already stopped: the engine is told once
    assert rig.scheduler.get("a").stopped_choices == [1]
    assert not rig.scheduler.stop_choice("q", 0) and queued.state is S.PENDING  # the engine never got it
    rig.scheduler.on_finished("a", "stop")
    assert not rig.scheduler.stop_choice("a", 0) and not rig.scheduler.stop_choice("never", 0)
    assert rig.engine.stopped == [("a", 1)]


def test_prompt_log_probs_reach_the_sink_with_the_first_token() -> None:
    rig = make_rig()
    request = rig.submit("e")
    chunk = PromptLogprobs("e", [None, (-1.5, ((3, -1.5),))], 0)
    rig.scheduler.on_prompt_logprobs(chunk)
    assert request.sink.read_nowait() is None  # nothing to render before the first token
    rig.scheduler.on_token(tok("e", 9), batch_size=1)
    item = request.sink.read_nowait()
    assert list(item.prompt) == [chunk] and [t.token_id for t in item.tokens] == [9]
    rig.scheduler.cancel("e")
    rig.scheduler.on_prompt_logprobs(PromptLogprobs("e", [None], 0))  # after the end: dropped, not counted
    rig.scheduler.on_prompt_logprobs(PromptLogprobs("never-seen", [None], 0))
    assert rig.scheduler.late_events == 0
