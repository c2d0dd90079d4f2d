"""`pegainfer serve`: settings, runtime, HTTP server; SIGTERM/SIGINT start a staged drain (stop
admitting with 503, let in-flight requests finish up to --drain-timeout, cancel the rest, stop the
expert ranks) and the process then exits 0. An engine failure exits 1 so a supervisor restarts it."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from types import FrameType

import uvicorn

from daemon.app import build_app
from daemon.connections import ConnectionGuard, apply_budget
from daemon.http_protocol import protocol_factory
from daemon.notify import Notifier
from daemon.runtime import Runtime
from daemon.settings import resolve
from telemetry.setup import build_telemetry

log = logging.getLogger("pegainfer.daemon")


class DrainingServer(uvicorn.Server):
    """uvicorn, except that the first signal drains through the runtime instead of closing at once;
    a second signal forces the exit."""

    def __init__(self, config: uvicorn.Config, runtime: Runtime):
        super().__init__(config)
        self.runtime = runtime
        self.loop = asyncio.get_running_loop()
        self._signalled = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._signalled:
            self.force_exit = True
            self.should_exit = True
            return
        self._signalled = True
        self.loop.call_soon_threadsafe(self.runtime.begin_drain)


async def _serve(settings) -> int:
    notifier = Notifier.from_env()
    return await serve_runtime(Runtime(settings, build_telemetry(settings), notifier))


async def serve_runtime(runtime: Runtime) -> int:
    """Load the runtime's engine and serve HTTP until a drain or an engine failure ends it; the
    process's exit code. tools/bench_host_path.py runs it in-process to read its threads' clocks."""
    settings, notifier = runtime.settings, runtime.notifier
    http = protocol_factory(ConnectionGuard(apply_budget(settings)), settings.http_header_timeout)
    config = uvicorn.Config(build_app(runtime), host=settings.host, port=settings.port, loop="none",
                            log_level=settings.log_level, access_log=False, timeout_graceful_shutdown=5,
                            lifespan="off", http=http, ws="none")  # no WebSocket routes: upgrades stay HTTP
    server = DrainingServer(config, runtime)
    runtime.on_exit = lambda: setattr(server, "should_exit", True)
    loop = asyncio.get_running_loop()
    starter = loop.create_task(runtime.start(loop))
    watchdog = loop.create_task(notifier.watchdog(runtime)) if notifier else None
    await server.serve()
    for task in (starter, watchdog):
        if task is not None and not task.done():
            task.cancel()
    if runtime.engine is not None:
        runtime.close()
    runtime.tokenize.shutdown()
    return runtime.exit_code


def run_serve(args: argparse.Namespace) -> int:
    settings = resolve(args)
    logging.getLogger().setLevel(settings.log_level.upper())
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency; this keeps odd platforms working
        runner = asyncio.run
    code = runner(_serve(settings))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return code
