"""`pegainfer serve`: settings, runtime, HTTP server. SIGTERM/SIGINT start a staged drain (stop
admitting with 503, let in-flight requests finish up to --drain-timeout, cancel the rest with the
error code server_shutdown, stop the expert ranks). A second signal forces the stop: every request
still running is cancelled the same way at once, and the responses get a short bounded moment to
write that error chunk and [DONE] before the server closes; a third stops at once. The exit status
is 0 only when every accepted request finished; daemon.runtime says which status means what."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from types import FrameType
from typing import NoReturn

import uvicorn
from starlette.datastructures import Headers

from pegainfer.daemon.app import build_app
from pegainfer.daemon.connections import ConnectionGuard, apply_budget
from pegainfer.daemon.http_protocol import protocol_factory
from pegainfer.daemon.notify import Notifier
from pegainfer.daemon.runtime import Runtime
from pegainfer.daemon.settings import resolve_sourced
from pegainfer.daemon.startup_check import check_startup
from pegainfer.daemon.stats_log import log_stats
from pegainfer.daemon.telemetry_setup import telemetry_for
from pegainfer.engine.startup_log import log_event

log = logging.getLogger("pegainfer.daemon")


class DrainingServer(uvicorn.Server):
    """uvicorn, except that the first signal drains through the runtime instead of closing at once,
    the second forces the stop through the runtime (which cancels and flushes what is left), and
    only a third closes everything at once."""

    def __init__(self, config: uvicorn.Config, runtime: Runtime):
        super().__init__(config)
        self.runtime = runtime
        self.loop = asyncio.get_running_loop()
        self._signals = 0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals == 1:
            self.loop.call_soon_threadsafe(self.runtime.begin_drain)
        elif self._signals == 2:
            self.loop.call_soon_threadsafe(self.runtime.force_stop)
        else:
            self.stop(force=True)

    def stop(self, force: bool) -> None:
        """Leave the serve loop; `force`: without waiting for open connections to finish."""
        self.force_exit = self.force_exit or force
        self.should_exit = True


async def _serve(settings) -> int:
    notifier = Notifier.from_env()
    return await serve_runtime(Runtime(settings, telemetry_for(settings), notifier))


async def serve_runtime(runtime: Runtime) -> int:
    """Load the runtime's engine and serve HTTP until a drain or an engine failure ends it; the
    process's exit code. tools/dev/bench_host_path.py runs it in-process to read its threads' clocks."""
    settings, notifier = runtime.settings, runtime.notifier
    def refused(scope: dict, e) -> None:  # a connection over the cap, answered 503: a refused request
        runtime.telemetry.on_front_rejection(e.status, e.message, Headers(scope=scope), e.code)

    http = protocol_factory(ConnectionGuard(apply_budget(settings)), settings.http_header_timeout, refused)
    # log_config=None: uvicorn's loggers keep no handlers of their own and reach the root's JSON lines
    # (telemetry/logs.py); its access log stays off (--access-log is daemon/access_log.py's)
    config = uvicorn.Config(build_app(runtime), host=settings.host, port=settings.port, loop="none",
                            log_level=settings.log_level, access_log=False, log_config=None,
                            timeout_graceful_shutdown=5, lifespan="off", http=http,
                            ws="none")  # no WebSocket routes: upgrades stay HTTP
    server = DrainingServer(config, runtime)
    runtime.on_exit = server.stop
    loop = asyncio.get_running_loop()
    starter = loop.create_task(runtime.start(loop))
    watchdog = loop.create_task(notifier.watchdog(runtime)) if notifier else None
    stats = loop.create_task(log_stats(runtime))  # the periodic stats line (daemon/stats_log.py)
    await server.serve()
    for task in (starter, watchdog, stats):
        if task is not None and not task.done():
            task.cancel()
    if runtime.engine is not None:
        runtime.close()
    else:
        runtime.telemetry.shutdown()  # flushed here: run_serve ends the process without teardown
    runtime.tokenize.shutdown()
    code = runtime.final_exit_code()
    if code != runtime.exit_code:  # responses cut off after the drain: the server stopped under them
        log_event("exit_status", exit_code=code, responses_cut=runtime.open_responses.cut,
                  responses_open=runtime.open_responses.open)
    return code


def run_serve(args: argparse.Namespace) -> NoReturn:
    settings, sources = resolve_sourced(args)
    # Refuse what cannot start (a missing model folder, no CUDA, nccl without a GPU per rank, a
    # test-only transport) before the port is bound or anything loads: one line (daemon.cli), exit 2.
    check_startup(settings, sources)
    logging.getLogger().setLevel(settings.log_level.upper())
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency; this keeps odd platforms working
        runner = asyncio.run
    code = runner(_serve(settings))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _exit_without_teardown(code)


def _exit_without_teardown(code: int) -> NoReturn:
    """End the process once serving is over, everything stopped and every log and trace flushed,
    without the interpreter's teardown: it would add only native extensions' reports (triton's
    nanobind "leaked instances" lines), plain text at the end of a JSON-lines log."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
