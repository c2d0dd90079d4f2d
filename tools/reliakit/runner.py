"""A live run: the baseline output, then each selected scenario against the server (spawned
daemons or --url), each followed by an idle check and the clean follow-up, then the final idle
baseline; once every daemon has stopped (so its trace file is complete) the strict rules are
decided over client observations joined with the trace records."""
from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import httpx

from tools.benchkit.redact import redact_url
from tools.reliakit import client as c
from tools.reliakit import server_checks as sc
from tools.reliakit import server_spans
from tools.reliakit.check import PASS, Check, verdict
from tools.reliakit.daemon import DaemonError, SpawnedDaemon
from tools.reliakit.daemon_pool import DaemonPool
from tools.reliakit.limits import ServerUnusable, read_limits
from tools.reliakit.log_checks import no_tracebacks
from tools.reliakit.ready_probe import ReadyProbe, wait_idle
from tools.reliakit.result import SKIPPED, ScenarioRun
from tools.reliakit.run_record import RunRecord
from tools.reliakit.scenario import SHARED_FLAGS, Context, Scenario
from tools.reliakit.workload import REQUEST_TIMEOUT_S, follow_up

SCENARIO_TIMEOUT_S = 180.0
TRACE_WAIT_S = 10.0


@dataclasses.dataclass(slots=True)
class RunConfig:
    scenarios: list[Scenario]
    url: str | None = None  # --url; None: --spawn
    trace_file: Path | None = None  # with --url
    model: str | None = None
    backend: str = "local"
    ep_size: int = 1
    work_dir: Path | None = None
    device: str = "cpu"  # with --spawn: the daemons' --device
    random_preset: str | None = None  # with --spawn: serve a preset's random weights instead of --model

    @property
    def spawn(self) -> bool:
        return self.url is None


class Runner:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.t0 = time.monotonic()
        self.pool = DaemonPool(cfg.work_dir, cfg.model, cfg.backend, cfg.ep_size, cfg.device,
                                cfg.random_preset) if cfg.spawn else None
        self.record = RunRecord()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def run(self) -> RunRecord:
        try:
            asyncio.run(self._live())
        finally:
            if self.pool is not None:
                self.pool.stop_all()
        self._decide()
        return self.record

    # ---- the live part ------------------------------------------------------------------------
    async def _server(self, flags: tuple[str, ...] | None) -> tuple[str, SpawnedDaemon | None]:
        if self.pool is None:
            return self.cfg.url, None
        d = await asyncio.to_thread(self.pool.ensure, flags) if flags is not None else \
            await asyncio.to_thread(self.pool.restart)
        return d.url, d

    async def _live(self) -> None:
        rec, cfg = self.record, self.cfg
        runnable = [s for s in cfg.scenarios if not (cfg.spawn and s.min_ep_size > cfg.ep_size)]
        try:
            url, _ = await self._server(runnable[0].flags if runnable else SHARED_FLAGS)
            async with httpx.AsyncClient(headers=c.AUTH, base_url=url, timeout=REQUEST_TIMEOUT_S) as http:
                rec.limits = await read_limits(http)
                rec.baseline = follow_up(rec.limits.model, "baseline")
                await c.stream(http, rec.baseline, self.now, timeout=REQUEST_TIMEOUT_S)
        except (DaemonError, ServerUnusable) as e:
            rec.run_checks.append(Check("server_started", "fail", str(e)[:2000]))
            return
        for scenario in cfg.scenarios:
            rec.scenarios.append(run := ScenarioRun(scenario.name, scenario.description))
            if cfg.spawn and scenario.min_ep_size > cfg.ep_size:
                run.status, run.skip_reason = SKIPPED, f"needs --ep-size >= {scenario.min_ep_size} (got {cfg.ep_size})"
                continue
            try:
                await self._scenario(scenario, run)
            except (DaemonError, ServerUnusable) as e:
                run.checks.append(Check("server_started", "fail", str(e)[:2000]))
            except Exception as e:  # noqa: BLE001 - recorded as a failed check; the run goes on
                run.checks.append(Check("runner_error", "fail", f"{type(e).__name__}: {e}"))
        await self._final()

    async def _scenario(self, scenario: Scenario, run: ScenarioRun) -> None:
        url, daemon = await self._server(scenario.flags)
        async with httpx.AsyncClient(headers=c.AUTH, base_url=url, timeout=REQUEST_TIMEOUT_S) as http:
            limits = await read_limits(http)
            reason = scenario.skip_reason(limits, self.cfg.spawn)
            if reason is not None:
                run.status, run.skip_reason = SKIPPED, reason
                return
            run.limits = limits
            run.server = {"url": redact_url(url), "daemon": daemon.index if daemon else None,
                          "flags": list(scenario.flags) if daemon else None}
            run.observations = scenario.plan(limits)
            probe = ReadyProbe(http, self.now)
            ctx = Context(url, http, self.now, limits, probe, daemon, run.facts)
            started = self.now()
            try:
                async with probe:
                    async with asyncio.timeout(SCENARIO_TIMEOUT_S):
                        await scenario.drive(ctx, run.observations)
                run.checks.append(Check("scenario_ran", PASS, "the scenario drove all its requests"))
            except TimeoutError:
                run.checks.append(Check("scenario_ran", "fail", f"not done after {SCENARIO_TIMEOUT_S:g} s"))
            except Exception as e:  # noqa: BLE001 - recorded as a failed check; the run goes on
                run.checks.append(Check("scenario_ran", "fail", f"{type(e).__name__}: {e}"))
            run.duration_s = round(self.now() - started, 3)
            run.probe = probe.to_dict()
            # a scenario that ends its server has no idle_after (not a skip: no server is left to be idle;
            # the restarted server's follow-up is checked instead)
            if not scenario.ends_server and daemon is not None and not daemon.alive():
                run.checks.append(Check("idle_after", "fail", f"the daemon exited ({daemon.proc.returncode}) "
                                                              f"during a scenario that must not end it"))
                daemon.ended_by = "crashed"
            elif not scenario.ends_server:
                run.checks.append(sc.idle("idle_after", *await wait_idle(http)))
        if daemon is not None and (scenario.ends_server or not daemon.alive()):
            if daemon.alive():  # it should have ended: never reuse a draining or half-dead daemon
                await asyncio.to_thread(daemon.kill)
            url, daemon = await self._server(None)
            run.server["restarted_for_follow_up"] = daemon.index
        async with httpx.AsyncClient(headers=c.AUTH, base_url=url, timeout=REQUEST_TIMEOUT_S) as http:
            run.follow_up = follow_up(run.limits.model)
            await c.stream(http, run.follow_up, self.now, timeout=REQUEST_TIMEOUT_S)

    async def _final(self) -> None:
        url = self.cfg.url
        if self.pool is not None:
            if self.pool.current is None:
                return
            url = self.pool.current.url if self.pool.current.alive() else (await self._server(None))[0]
        async with httpx.AsyncClient(headers=c.AUTH, base_url=url, timeout=REQUEST_TIMEOUT_S) as http:
            status, body = await wait_idle(http)
        self.record.final = sc.idle("final_idle", status, body)

    # ---- deciding -----------------------------------------------------------------------------
    def _decide(self) -> None:
        rec = self.record
        if self.pool is not None:
            rec.daemons = [d.to_dict() for d in self.pool.daemons]
            rec.trace_files = [str(p) for p in self.pool.trace_files]
            spans = server_spans.read(self.pool.trace_files)
            rec.run_checks.append(_daemon_exits(self.pool.daemons))
            rec.run_checks.append(no_tracebacks([d.log_path for d in self.pool.daemons]))
        elif self.cfg.trace_file is not None:
            rec.trace_files = [str(self.cfg.trace_file)]
            ids = {x.trace_id for x in rec.observations() if x.sent}
            spans = server_spans.read_until_covered([self.cfg.trace_file], ids, TRACE_WAIT_S)
        else:
            spans = None
        by_name = {s.name: s for s in self.cfg.scenarios}
        for run in rec.scenarios:
            run.finalize(by_name[run.name], rec.baseline, spans)
        rec.decide(spans)


def _daemon_exits(daemons: list[SpawnedDaemon]) -> Check:
    """Every daemon the runner stopped with SIGTERM drained and exited 0 (a hang is killed and fails)."""
    problems = []
    for d in daemons:
        if d.ended_by == "forced_kill":
            problems.append(f"daemon {d.index} did not exit after SIGTERM and was killed")
        elif d.ended_by == "runner_sigterm" and d.exit_code != 0:
            problems.append(f"daemon {d.index} exited {d.exit_code} after SIGTERM")
        elif d.ended_by == "crashed":
            problems.append(f"daemon {d.index} exited on its own ({d.exit_code})")
    return verdict("daemon_exits", problems, f"all {len(daemons)} daemons ended as intended")
