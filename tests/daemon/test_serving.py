"""Serving behaviour against a real daemon: concurrent requests are exact and really batched, a
client that goes away frees its slot and stops generation, SIGTERM drains and exits 0."""
from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import pytest

from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.generate import generate
from pegainfer.engine.tokenizer import Tokenizer
from tests.daemon_process import DaemonProcess

PROMPTS = ["Hello", "The weather in the mountains is cold in winter and the snow falls for days.", "日本語のテキスト",
           "x", "Numbers: 1 2 3 4 5 6 7 8 9 10", "Hello", "🎉 party", "def f(x):\n    return x"]
MAX_TOKENS = [20, 7, 15, 30, 3, 20, 11, 25]


@pytest.fixture(scope="module", params=["step-by-step", "async-scheduling", "async-admission"])
def daemon(request, tiny_model_dir):
    extra = {"step-by-step": ["--no-async-scheduling"], "async-scheduling": [],
             "async-admission": ["--async-admission"]}[request.param]
    with DaemonProcess("--model", str(tiny_model_dir), "--served-model-name", "tiny", "--max-active", "8",
                       *extra) as d:
        yield d


def ready(d) -> dict:
    return httpx.get(d.url + "/ready", timeout=10).json()


def test_concurrent_mixed_requests_exact_and_batched(daemon, tiny_model_dir):
    tok = Tokenizer(str(tiny_model_dir))
    engine = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=1))
    expected = [tok.decode(generate(engine, [tok.encode(p)], m, ignore_eos=True)[0].token_ids)
                for p, m in zip(PROMPTS, MAX_TOKENS)]
    engine.close()

    async def one(client, p, m, stream):
        body = {"model": "tiny", "prompt": p, "max_tokens": m, "ignore_eos": True, "stream": stream}
        if not stream:
            r = await client.post("/v1/completions", json=body)
            return r.json()["choices"][0]["text"]
        text = ""
        async with client.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    text += json.loads(line[6:])["choices"][0]["text"]
        return text

    async def all_at_once():
        async with httpx.AsyncClient(base_url=daemon.url, timeout=120) as c:
            return await asyncio.gather(*(one(c, p, m, i % 2 == 0) for i, (p, m) in
                                          enumerate(zip(PROMPTS, MAX_TOKENS))))

    before = ready(daemon)["engine"]
    got = asyncio.run(all_at_once())
    assert got == expected
    after = ready(daemon)
    # evidence from the engine: decode steps that carried several requests at different positions
    assert after["engine"]["decode_batch_max"] >= 4
    assert after["engine"]["steps"] - before["steps"] < sum(MAX_TOKENS)
    assert after["scheduler"]["running"] == 0 and after["kv_slots_free"] == after["kv_slots_total"]
    # --async-scheduling: decode steps were launched before the step ahead of them was read
    assert after["engine"]["async_scheduling"] == (after["engine"]["overlapped_steps"] > before["overlapped_steps"])


def test_disconnect_frees_slot_and_stops_generation(daemon):
    before = ready(daemon)
    with httpx.stream("POST", daemon.url + "/v1/completions", timeout=60,
                      json={"prompt": [5, 6, 7], "max_tokens": 3000, "stream": True, "ignore_eos": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = ready(daemon)
        if now["scheduler"]["disconnected"] > before["scheduler"]["disconnected"] and \
                now["kv_slots_free"] == now["kv_slots_total"] and now["engine"]["running"] == 0:
            break
        time.sleep(0.02)
    else:
        pytest.fail(f"slot not freed: {ready(daemon)}")
    steps = now["engine"]["steps"]
    time.sleep(0.5)
    assert ready(daemon)["engine"]["steps"] == steps  # the engine stopped generating for it
    assert now["scheduler"]["running"] == 0


def test_drain_finishes_accepted_refuses_new_exits_zero(tiny_model_dir):
    d = DaemonProcess("--model", str(tiny_model_dir), "--drain-timeout", "60")
    d.start()
    body = {"prompt": [5, 6], "max_tokens": 150, "stream": True, "ignore_eos": True}
    lines: list[str] = []
    with httpx.stream("POST", d.url + "/v1/completions", json=body, timeout=60) as r:
        it = r.iter_lines()
        lines.append(next(line for line in it if line.startswith("data: ")))
        d.signal(signal.SIGTERM)
        time.sleep(0.3)
        refused = httpx.post(d.url + "/v1/completions", json={"prompt": "hi"}, timeout=10)
        lines += [line for line in it if line.startswith("data: ")]
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"
    assert d.wait(60) == 0


def test_drain_timeout_cancels_the_rest(tiny_model_dir):
    """What the drain timeout cancels ends with a server_shutdown error chunk and [DONE], and the
    exit status is not 0: an accepted request did not finish, and a supervisor must know."""
    d = DaemonProcess("--model", str(tiny_model_dir), "--drain-timeout", "0.5")
    d.start()
    body = {"prompt": [5, 6], "max_tokens": 4000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", d.url + "/v1/completions", json=body, timeout=60) as r:
        it = r.iter_lines()
        next(line for line in it if line.startswith("data: "))
        d.signal(signal.SIGTERM)
        rest = [line for line in it if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    err = json.loads(rest[-2][6:])["error"]
    assert err["code"] == "server_shutdown" and "shutting down" in err["message"]
    assert d.wait(60) not in (0, None)


@pytest.mark.parametrize("backend, says", [
    ("nccl", "--backend nccl needs one CUDA GPU per rank, but --device cpu is not a GPU; use --backend host-staged"),
    ("nccl-over-gloo-test", "--backend nccl-over-gloo-test is test-only"),
])
def test_serve_refuses_a_transport_that_cannot_run_here_before_binding(backend, says, tmp_path):
    """`serve --backend nccl --device cpu` (and the test-only transport) exits non-zero before it
    binds the port or loads anything: its whole output is one line that names the way out."""
    d = DaemonProcess("--random-preset", "tiny", "--device", "cpu", "--backend", backend, "--ep-size", "2",
                      log_path=tmp_path / "serve.log")
    d.start(wait_ready=False)
    assert d.wait(60) == 2  # a usage error: systemd's RestartPreventExitStatus=2 does not retry it
    [line] = d.log().strip().splitlines()
    assert line.startswith("pegainfer: error: ") and says in line, line
