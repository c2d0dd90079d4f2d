"""What /ready says while a scenario runs: a poller that keeps the largest running and waiting
counts, the engine's decode-batch maximum and every status it saw (with when a 503 first showed),
and the idle predicate the leaked-slot rule uses."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Self

import httpx

from tools.reliakit import client as c

POLL_S = 0.02


class ReadyProbe:
    def __init__(self, http: httpx.AsyncClient, now: Callable[[], float], interval_s: float = POLL_S):
        self.http = http
        self.now = now
        self.interval_s = interval_s
        self.samples = 0
        self.running_max = 0
        self.waiting_max = 0
        self.decode_batch_max: int | None = None
        self.statuses: dict[str, int] = {}
        self.first_503_s: float | None = None
        self._task: asyncio.Task | None = None

    def take(self, status: int | None, body: dict) -> None:
        self.samples += 1
        key = str(status) if status is not None else "no_answer"
        self.statuses[key] = self.statuses.get(key, 0) + 1
        if status == 503 and self.first_503_s is None:
            self.first_503_s = self.now()
        sched = body.get("scheduler") or {}
        self.running_max = max(self.running_max, int(sched.get("running", 0)))
        self.waiting_max = max(self.waiting_max, int(sched.get("waiting", 0)))
        engine = body.get("engine") or {}
        if "decode_batch_max" in engine:
            self.decode_batch_max = max(self.decode_batch_max or 0, int(engine["decode_batch_max"]))

    async def _loop(self) -> None:
        while True:
            self.take(*await c.ready(self.http, timeout=2.0))
            await asyncio.sleep(self.interval_s)

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def to_dict(self) -> dict:
        return {"samples": self.samples, "running_max": self.running_max, "waiting_max": self.waiting_max,
                "decode_batch_max": self.decode_batch_max, "statuses": dict(sorted(self.statuses.items())),
                "first_503_s": None if self.first_503_s is None else round(self.first_503_s, 3)}


def idle_problems(status: int | None, body: dict) -> list[str]:
    """Why a /ready answer is not the idle baseline (empty: it is): 200, nothing running or
    waiting in the scheduler or the engine, every KV slot free, and (a paged server) no KV page in
    use: a cancel or a disconnect that leaked a page fails here."""
    if status != 200:
        return [f"/ready answered {status if status is not None else 'nothing'}"]
    problems = []
    sched, engine = body.get("scheduler") or {}, body.get("engine") or {}
    for where, part in (("scheduler", sched), ("engine", engine)):
        for key in ("running", "waiting"):
            if part.get(key) != 0:
                problems.append(f"{where}.{key} = {part.get(key)}")
    free, total = body.get("kv_slots_free"), body.get("kv_slots_total")
    if free is None or total is None or free != total:
        problems.append(f"kv_slots_free {free} of {total}")
    pages = body.get("kv_pages")
    if pages is not None and pages.get("in_use") != 0:  # a paged server: every page back (cached ones are free)
        problems.append(f"kv_pages in_use {pages.get('in_use')} of {pages.get('total')}")
    return problems


def idle_summary(status: int | None, body: dict) -> dict:
    sched, engine = body.get("scheduler") or {}, body.get("engine") or {}
    return {"status": status, "running": sched.get("running"), "waiting": sched.get("waiting"),
            "engine_running": engine.get("running"), "engine_waiting": engine.get("waiting"),
            "kv_slots_free": body.get("kv_slots_free"), "kv_slots_total": body.get("kv_slots_total"),
            "kv_pages_in_use": (body.get("kv_pages") or {}).get("in_use")}


async def wait_idle(http: httpx.AsyncClient, timeout_s: float = 10.0) -> tuple[int | None, dict]:
    """Poll /ready until it shows the idle baseline or `timeout_s` passes; the last answer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        status, body = await c.ready(http)
        if not idle_problems(status, body) or loop.time() >= deadline:
            return status, body
        await asyncio.sleep(0.05)
