"""The real daemon in this process, without a port: the Runtime (the tiny engine, its GPU thread,
scheduler, tokenizer, chat template) started on the event loop of starlette's TestClient, and the
app driven through that client, or through the official openai client over it (the TestClient is an
httpx.Client). Cheaper than a spawned `pegainfer serve` (no interpreter start-up, no port); what
only a real process shows (signals, exit status, the HTTP layer below the app) stays with
tests/daemon_process.py."""
from __future__ import annotations

import asyncio
from pathlib import Path
from unittest import mock

import openai
from starlette.testclient import TestClient

from pegainfer.daemon.app import build_app
from pegainfer.daemon.runtime import Runtime
from pegainfer.daemon.settings import Settings
from pegainfer.telemetry.hub import Telemetry


class InProcessDaemon:
    def __init__(self, model_dir: str | Path, **settings: object) -> None:
        self.rt = Runtime(Settings(model=str(model_dir), **{"served_model_name": "tiny", **settings}), Telemetry())
        self.client = TestClient(build_app(self.rt), base_url="http://testserver")

    def __enter__(self) -> InProcessDaemon:
        self.client.__enter__()
        self.client.portal.call(self._start)
        if self.rt.load_error:
            self.__exit__(None, None, None)
            raise RuntimeError(f"the engine did not load: {self.rt.load_error}")
        return self

    async def _start(self) -> None:
        # not the serving-time collector and GIL settings: they would stay with the test process
        with mock.patch("pegainfer.daemon.runtime.tune_for_serving"):
            await self.rt.start(asyncio.get_running_loop())

    def __exit__(self, *exc: object) -> None:
        try:
            self.client.portal.call(self._close)
        finally:
            self.client.__exit__(*exc)
            self.rt.tokenize.shutdown()

    async def _close(self) -> None:
        if self.rt.engine is not None:
            await asyncio.to_thread(self.rt.close)

    def openai(self, **kw: object) -> openai.OpenAI:
        return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=self.client,
                             max_retries=0, **kw)

    def ready(self) -> dict:
        return self.client.get("/ready").json()

