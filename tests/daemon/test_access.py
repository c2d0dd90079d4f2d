"""Access and leaks, against a real daemon with an API key and the debug hooks on: the debug routes
need the key and check their arguments (a bad one used to kill the engine), the Authorization scheme
is case-insensitive, only a request's owner may cancel it, ids are random, bodies that are not JSON
get 415, and the framework's own 404/405 (and the trailing-slash case) answer in OpenAI error JSON."""
from __future__ import annotations

import json
import math
import re

import httpx
import pytest
from starlette.testclient import TestClient

from pegainfer.daemon import access
from pegainfer.daemon.app import build_app
from pegainfer.daemon.protocol import completion_id
from pegainfer.daemon.runtime import Runtime
from pegainfer.daemon.settings import Settings
from pegainfer.engine.contract import Stall
from pegainfer.lifecycle.scheduler import Scheduler
from pegainfer.telemetry.hub import Telemetry
from tests.daemon_process import DaemonProcess
from tests.lifecycle.fakes import FakeEngine, make_request

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ID = re.compile(r"^cmpl-[0-9a-f]{32}$")


@pytest.fixture(scope="module")
def daemon(tiny_model_dir):
    with DaemonProcess("--model", str(tiny_model_dir), "--served-model-name", "tiny", "--api-key", KEY,
                       "--debug-hooks", "--debug-traces", "--max-active", "2", "--access-log") as d:
        yield d
    assert "Traceback" not in d.log(), d.log()[-3000:]
    assert KEY not in d.log() and '"logger":"pegainfer.access"' in d.log()  # the access log never has the key


def assert_error(r: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and err["type"]
    if code is not None:
        assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    return err


def completion(d: DaemonProcess, headers=AUTH, **body) -> httpx.Response:
    return httpx.post(d.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, **body}, headers=headers,
                      timeout=60)


def assert_alive(d: DaemonProcess) -> None:
    assert httpx.get(d.url + "/health").json()["status"] == "ok"
    assert completion(d).status_code == 200


# ---- the debug routes --------------------------------------------------------------------------------
@pytest.mark.parametrize("method,path", [("POST", "/debug/stall?seconds=-1"), ("POST", "/debug/stall"),
                                         ("POST", "/debug/fail/cmpl-x"), ("GET", "/debug/traces")])
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}], ids=["no-key", "wrong-key"])
def test_debug_routes_need_the_key(daemon, method, path, headers):
    assert_error(httpx.request(method, daemon.url + path, headers=headers), 401, "invalid_api_key")
    assert_alive(daemon)


@pytest.mark.parametrize("seconds", ["-1", "0", "nan", "inf", "-inf", "1e999", "601", "abc", ""])
def test_debug_stall_checks_seconds_and_the_engine_survives(daemon, seconds):
    assert_error(httpx.post(f"{daemon.url}/debug/stall?seconds={seconds}", headers=AUTH), 400, param="seconds")
    assert_alive(daemon)


def test_debug_stall_with_the_key_stalls(daemon):
    r = httpx.post(daemon.url + "/debug/stall?seconds=0.2", headers=AUTH)
    assert r.status_code == 200 and r.json() == {"stalled_s": 0.2}
    assert_alive(daemon)


def test_debug_fail_of_an_unknown_request_is_404(daemon):
    assert_error(httpx.post(daemon.url + "/debug/fail/cmpl-nobody", headers=AUTH), 404, "request_not_found")


# ---- the key --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [f"bearer {KEY}", f"BEARER {KEY}", f"Bearer  {KEY}", f"bEaReR {KEY}"])
def test_bearer_scheme_is_case_insensitive(daemon, value):
    assert completion(daemon, headers={"Authorization": value}).status_code == 200


@pytest.mark.parametrize("value", [KEY, f"Basic {KEY}", f"Bearer{KEY}", "Bearer", f"Bearer {KEY}x"])
def test_other_authorization_values_are_401(daemon, value):
    assert_error(completion(daemon, headers={"Authorization": value}), 401, "invalid_api_key")


# ---- cancel and ids ------------------------------------------------------------------------------------
def test_owner_cancels_with_the_key_and_a_wrong_key_cannot(daemon):
    body = {"prompt": [5, 6], "max_tokens": 3000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", daemon.url + "/v1/completions", json=body, headers=AUTH, timeout=60) as r:
        rid = r.headers["x-request-id"]
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        assert_error(httpx.post(f"{daemon.url}/v1/completions/{rid}/cancel"), 401)
        c = httpx.post(f"{daemon.url}/v1/completions/{rid}/cancel", headers={"Authorization": f"bearer {KEY}"})
        assert c.status_code == 200 and c.json()["cancelled"] is True
        rest = [line for line in lines if line.startswith("data: ")]
    assert json.loads(rest[-2][6:])["error"]["code"] == "request_cancelled" and rest[-1] == "data: [DONE]"


def test_request_ids_are_128_random_bits(daemon):
    ids = [completion(daemon).json()["id"] for _ in range(8)]
    assert all(ID.match(i) for i in ids) and len(set(ids)) == len(ids)
    many = [completion_id() for _ in range(50_000)]
    assert all(ID.match(i) for i in many[:1000]) and len(set(many)) == len(many)
    # no shared prefix from a clock or a counter: every hex digit varies in the first position too
    assert len({i[5] for i in many}) == 16 and sorted(many[:100]) != many[:100]


def _app_with_a_request_owned_by(owner_token: str | None, api_key: str | None) -> tuple[TestClient, str]:
    """The real app and scheduler (the engine is a recording fake: the GPU side plays no part in
    who may cancel), holding one running request created by `owner_token`."""
    rt = Runtime(Settings(model="/nonexistent", api_key=api_key), Telemetry())
    rt.scheduler = Scheduler(FakeEngine(), max_active=2, max_pending=2)
    rt.scheduler.set_ready(True)
    request = make_request("cmpl-" + "a" * 32)
    request.owner = access.identity({"authorization": f"Bearer {owner_token}"} if owner_token else {}, api_key)
    rt.scheduler.submit(request)
    return TestClient(build_app(rt)), request.request_id


def test_only_the_owner_identity_may_cancel():
    """Two keys would give two identities: with the key K in force, a request created under another
    identity answers 404 to K, exactly as a missing id does; its owner's cancel answers 200."""
    client, rid = _app_with_a_request_owned_by("other-key", api_key=KEY)
    assert access.identity({"authorization": "Bearer other-key"}, KEY) != access.identity(AUTH, KEY)
    assert KEY not in access.identity(AUTH, KEY)  # a digest, never the secret
    theirs = assert_error(client.post(f"/v1/completions/{rid}/cancel", headers=AUTH), 404, "request_not_found")
    missing = assert_error(client.post("/v1/completions/cmpl-missing/cancel", headers=AUTH), 404)
    assert theirs == {**missing, "message": missing["message"].replace("cmpl-missing", rid)}
    client, rid = _app_with_a_request_owned_by(KEY, api_key=KEY)
    assert client.post(f"/v1/completions/{rid}/cancel", headers=AUTH).status_code == 200
    client, rid = _app_with_a_request_owned_by(None, api_key=None)  # no key: anyone, as before
    assert client.post(f"/v1/completions/{rid}/cancel").status_code == 200


# ---- content types and the framework's own errors -------------------------------------------------------
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          "application/xml", "text/json"])
def test_a_body_that_is_not_json_is_415(daemon, content_type):
    r = httpx.post(daemon.url + "/v1/completions", content=b'{"prompt": "hi", "max_tokens": 2}',
                   headers={**AUTH, "Content-Type": content_type})
    assert_error(r, 415, "unsupported_media_type")


@pytest.mark.parametrize("content_type", [None, "application/json", "application/json; charset=utf-8",
                                          "Application/JSON", "application/vnd.example+json"])
def test_json_content_types_and_none_are_accepted(daemon, content_type):
    headers = {**AUTH, **({"Content-Type": content_type} if content_type else {})}
    r = httpx.post(daemon.url + "/v1/completions", content=b'{"prompt": "hi", "max_tokens": 2}', headers=headers)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("method,path,status,code", [
    ("GET", "/nope", 404, "not_found"),
    ("POST", "/v1/embeddings", 404, "not_found"),
    ("GET", "/v1/chat/completions", 405, "method_not_allowed"),
    ("POST", "/v1/models/tiny", 405, "method_not_allowed"),
    ("POST", "/v1/completions/", 404, "not_found"),  # was a plain-text 307 to the slash-less path
    ("GET", "/health/", 404, "not_found"),
    ("GET", "/v1/completions", 405, "method_not_allowed"),
    ("DELETE", "/v1/models", 405, "method_not_allowed"),
    ("POST", "/ready", 405, "method_not_allowed"),
])
def test_framework_errors_are_openai_json(daemon, method, path, status, code):
    r = httpx.request(method, daemon.url + path, headers=AUTH, follow_redirects=False)
    assert_error(r, status, code)
    if status == 405:
        assert r.headers["allow"]


def test_an_unhandled_exception_is_a_stable_500_json():
    """Whatever a handler raises, the client gets a stable OpenAI error, never the exception's text."""
    rt = Runtime(Settings(model="/nonexistent"), Telemetry())

    def broken(runtime):
        raise RuntimeError("secret detail at /srv/pegainfer/telemetry/metrics.py:99")

    rt.telemetry.render_metrics = broken
    r = TestClient(build_app(rt), raise_server_exceptions=False).get("/metrics")
    err = assert_error(r, 500, "internal_error")
    assert "secret" not in r.text and "/srv" not in r.text and err["type"] == "server_error"


def test_health_names_no_server_internals():
    """/health is open to anyone: it says the engine failed, not the exception's text (the log has it)."""
    from pegainfer.daemon.runtime import Phase
    rt = Runtime(Settings(model="/nonexistent"), Telemetry())
    rt.load_error, rt.phase = "FileNotFoundError: /var/lib/pegainfer/models/x/config.json", Phase.DEAD
    r = TestClient(build_app(rt)).get("/health")
    assert r.status_code == 503 and r.json()["error"] == "the engine failed to load" and "/var" not in r.text


@pytest.mark.parametrize("seconds", [-1.0, math.nan, math.inf, 601.0, "5"])
def test_a_bad_stall_never_reaches_the_gpu_thread(seconds):
    """time.sleep raises on these inside the GPU thread, which would end the engine: the command
    itself refuses them, on the sender's side."""
    with pytest.raises(ValueError):
        Stall(seconds)
    assert Stall(0.5).seconds == 0.5


# ---- rejections: /ready and /metrics count the same ones --------------------------------------------------
def test_ready_and_metrics_agree_on_rejections_after_a_mix(daemon):
    """The issue's case: /ready said 2 rejected (the scheduler's) while /metrics said 16 (front ones
    too). Both now give front (401, 415, bad JSON...) and scheduler (over the context) counts."""
    from tests.telemetry.prom import total, value
    assert_error(completion(daemon, headers={}), 401)
    assert_error(httpx.post(daemon.url + "/v1/completions", content=b"{}", headers={**AUTH, "Content-Type": "text/xml"}),
                 415)
    assert_error(httpx.post(daemon.url + "/v1/completions", content=b'{"prompt": ', headers=AUTH), 400)
    assert_error(completion(daemon, max_tokens=1_000_000), 400, "context_length_exceeded")
    ready = httpx.get(daemon.url + "/ready").json()
    metrics = httpx.get(daemon.url + "/metrics").text
    front, scheduler = ready["rejected"]["front"], ready["rejected"]["scheduler"]
    assert front >= 3 and scheduler >= 1 and ready["scheduler"]["rejected"] == scheduler
    assert total(metrics, "pegainfer:requests_rejected_total", stage="front") == front
    assert total(metrics, "pegainfer:requests_rejected_total", stage="scheduler") == scheduler
    assert value(metrics, "pegainfer:requests_terminal_total", terminal_reason="rejected") == front + scheduler
    for code in ("invalid_api_key", "unsupported_media_type", "invalid_request"):
        assert value(metrics, "pegainfer:requests_rejected_total", stage="front", code=code) >= 1, code
