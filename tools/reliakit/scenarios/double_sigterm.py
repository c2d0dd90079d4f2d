"""double_sigterm: long streams fill all but one slot; once each has a token, a long JSON request
and one more stream take the last slot and a place in the queue; SIGTERM, then, once /ready says
503 (draining), SIGTERM again: the forced stop. Every accepted stream must end with an error chunk
(code `server_shutdown`) and then [DONE], or have completed in full if it finished before the second
signal; none may be cut off silently, at least one must have been running at the second signal, the
JSON request must get a 503 with code `server_shutdown`, and the daemon must exit with a non-zero
status within the bound, because accepted requests did not finish. Needs --spawn."""
from __future__ import annotations

import asyncio
import signal

from tools.reliakit import client as c
from tools.reliakit import observation as o
from tools.reliakit.check import verdict
from tools.reliakit.limits import Limits
from tools.reliakit.observation import Expectation, RequestObservation, completes
from tools.reliakit.scenario import Context, Scenario, ScenarioError
from tools.reliakit.workload import REQUEST_TIMEOUT_S, body, long_tokens, words

SHUTDOWN = "server_shutdown"
READY_503_WITHIN_S = 5.0
END_WITHIN_S = 10.0  # from the second SIGTERM to each stream's last byte
EXIT_WITHIN_S = 30.0


def plan(limits: Limits) -> list[RequestObservation]:
    """Streams for all slots but one, then the JSON request and a stream that waits in the queue."""
    n = long_tokens(limits.max_model_len, 64, 400)
    cut = Expectation(o.ERROR_CHUNK, ("cancelled",), error_code=SHUTDOWN)
    labels = [f"stream_{i}" for i in range(max(1, limits.max_active - 1))]
    labels += ["stream_queued"] if limits.max_pending >= 1 else []
    streams = [RequestObservation(label, None, cut, body(limits.model, words(16, 60 + i), n), n)
               for i, label in enumerate(labels)]
    whole = {k: v for k, v in body(limits.model, words(16, 70), n).items() if k not in ("stream", "stream_options")}
    plain = RequestObservation("json_request", None, Expectation(o.HTTP_ERROR, ("cancelled",), 503, None, SHUTDOWN),
                               whole, n)
    return streams + [plain]


async def drive(ctx: Context, planned: list[RequestObservation]) -> None:
    if ctx.daemon is None:
        raise ScenarioError("double_sigterm needs a daemon the runner started (--spawn)")
    *streams, plain = planned
    first, late = [x for x in streams if x.label != "stream_queued"], [x for x in streams if x.label == "stream_queued"]
    firsts = [asyncio.Event() for _ in first]
    tasks = [asyncio.create_task(c.stream(ctx.http, x, ctx.now, timeout=REQUEST_TIMEOUT_S, first_token=e))
             for x, e in zip(first, firsts)]
    await asyncio.gather(*(e.wait() for e in firsts))
    tasks += [asyncio.create_task(c.stream(ctx.http, x, ctx.now, timeout=REQUEST_TIMEOUT_S)) for x in late]
    tasks.append(asyncio.create_task(c.post(ctx.http, plain, ctx.now, timeout=REQUEST_TIMEOUT_S)))
    loop = asyncio.get_running_loop()
    deadline, held = loop.time() + READY_503_WITHIN_S, 0
    while loop.time() < deadline and held < len(planned):  # every request is running or queued
        _, ready = await c.ready(ctx.http)
        sched = ready.get("scheduler") or {}
        held = sched.get("running", 0) + sched.get("waiting", 0)
        await asyncio.sleep(0.01)
    ctx.facts["held_at_first_sigterm"] = held
    ctx.facts["first_sigterm_s"] = round(ctx.now(), 3)
    ctx.daemon.signal(signal.SIGTERM)
    deadline, status = loop.time() + READY_503_WITHIN_S, None
    while loop.time() < deadline:
        status, _ = await c.ready(ctx.http)
        if status == 503:
            break
        await asyncio.sleep(0.01)
    ctx.facts["ready_status_while_draining"] = status
    ctx.facts["running_at_second_sigterm"] = sum(not t.done() for t in tasks[:len(streams)])
    ctx.facts["second_sigterm_s"] = round(ctx.now(), 3)
    ctx.daemon.signal(signal.SIGTERM)
    await asyncio.gather(*tasks)
    code = await asyncio.to_thread(ctx.daemon.wait, EXIT_WITHIN_S)
    ctx.daemon.ended_by = "scenario"
    ctx.facts.update(exit_code=code, exit_s=round(ctx.now(), 3))
    for x in streams:  # it finished before the forced stop: then it must have finished in full
        if x.outcome == o.COMPLETED:
            x.expect = completes(x.max_tokens)


def checks(observations, facts, limits):
    second, code = facts.get("second_sigterm_s"), facts.get("exit_code")
    streams = [x for x in observations if x.label.startswith("stream_")]
    silent, late = [], []
    for x in streams:
        shut = x.outcome == o.ERROR_CHUNK and isinstance(x.error, dict) and x.error.get("code") == SHUTDOWN
        if not ((shut and x.done) or x.outcome == o.COMPLETED):
            silent.append(f"{x.label}: {x.outcome}{'' if x.done else ', no [DONE]'} ({x.note or x.error})")
        elif shut and (second is None or x.end_s is None or x.end_s - second > END_WITHIN_S):
            late.append(f"{x.label}: ended {'?' if x.end_s is None or second is None else round(x.end_s - second, 2)}"
                        f" s after the second SIGTERM")
    shut_down = sum(x.outcome == o.ERROR_CHUNK for x in streams)
    return [
        verdict("none_cut_silently", silent + late,
                f"every stream ended with a server_shutdown error chunk and [DONE] within {END_WITHIN_S:g} s of "
                f"the second SIGTERM, or completed in full"),
        verdict("forced_stop_tested", [] if shut_down and facts.get("running_at_second_sigterm") else
                ["no stream was still running at the second SIGTERM: nothing was forced"],
                f"{shut_down} of {len(streams)} streams were running at the second SIGTERM"),
        verdict("exit_status_nonzero",
                [] if code not in (None, 0) else
                [f"still running {EXIT_WITHIN_S:g} s after the second SIGTERM" if code is None else "exit status 0"],
                f"the daemon exited with status {code}"),
    ]


def dry_facts(observations, limits):
    streams = len(observations) - 1
    return {"held_at_first_sigterm": len(observations), "first_sigterm_s": 1.0, "ready_status_while_draining": 503,
            "running_at_second_sigterm": streams,
            "second_sigterm_s": 1.1, "exit_code": 3, "exit_s": 2.0}


SCENARIO = Scenario(
    name="double_sigterm", description=__doc__.split(": ", 1)[1].replace("\n", " "),
    plan=plan, drive=drive, checks=checks, dry_facts=dry_facts, ends_server=True)
