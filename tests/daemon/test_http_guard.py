"""The HTTP layer against real daemons (issue 32, item 5, and the plain-text answers of item 7):
slowloris connections are closed within the header timeout while normal requests go on, a body
that stops arriving gets a 408, the connection cap evicts idle connections or answers a JSON 503
and recovers, a low descriptor limit is warned about at start-up and still never resets clients,
and bytes that are not HTTP get a JSON 400. No daemon log holds a Traceback."""
from __future__ import annotations

import json
import resource
import select
import socket
import time

import httpx
import pytest

from pegainfer.daemon.connections import EVICT_GRACE_S
from tests.daemon_process import DaemonProcess

pytestmark = pytest.mark.slow

HEADER_S = 1.0
BODY_S = 1.0
SLACK_S = 1.5
PARTIAL = b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
SHORT = {"prompt": "Hello", "max_tokens": 4, "ignore_eos": True}


def no_traceback(d: DaemonProcess) -> None:
    assert "Traceback" not in d.log(), d.log()[-4000:]


@pytest.fixture(scope="module")
def daemon(tiny_model_dir):
    d = DaemonProcess("--model", str(tiny_model_dir), "--max-model-len", "256",
                      "--http-header-timeout", str(HEADER_S), "--http-body-timeout", str(BODY_S))
    with d:
        yield d
    no_traceback(d)


def connect(d: DaemonProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", d.port), timeout=30)


def read_all(s: socket.socket) -> bytes:
    out = b""
    while part := s.recv(65536):
        out += part
    return out


def response(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def assert_error_json(raw: bytes, status: int, code: str) -> dict[str, str]:
    got, headers, body = response(raw)
    assert got == status, raw[:300]
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]
    assert body["error"]["code"] == code, body
    return headers


def assert_status(d: DaemonProcess, status: int) -> None:
    r = httpx.post(d.url + "/v1/completions", json=SHORT, timeout=30)
    assert r.status_code == status, r.text


def ok(d: DaemonProcess) -> None:
    r = httpx.post(d.url + "/v1/completions", json=SHORT, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text


# ---- header and body deadlines --------------------------------------------------------------------
def test_slowloris_connections_are_closed_within_the_header_timeout(daemon):
    """50 connections send a partial request and then one more header line every 0.2 s: the deadline
    counts from the connection's opening, so the trickle does not extend it."""
    socks = [connect(daemon) for _ in range(50)]
    opened = time.monotonic()
    for s in socks:
        s.sendall(PARTIAL)
    ok(daemon)  # served meanwhile
    closed: dict[socket.socket, tuple[float, bytes]] = {}
    replies = {s: b"" for s in socks}
    while len(closed) < len(socks) and time.monotonic() - opened < HEADER_S + SLACK_S + 2:
        readable, _, _ = select.select([s for s in socks if s not in closed], [], [], 0.2)
        for s in readable:
            part = s.recv(65536)
            replies[s] += part
            if not part:
                closed[s] = (time.monotonic() - opened, replies[s])
        for s in socks:
            if s not in closed:
                try:
                    s.sendall(b"x-slow: 1\r\n")
                except OSError:
                    pass
    for s in socks:
        s.close()
    assert len(closed) == len(socks), f"{len(socks) - len(closed)} slow connections still open"
    assert max(t for t, _ in closed.values()) < HEADER_S + SLACK_S
    for _, raw in closed.values():
        assert_error_json(raw, 408, "request_timeout")
    ok(daemon)


def test_a_connection_that_sends_nothing_is_closed_silently(daemon):
    with connect(daemon) as s:
        t0 = time.monotonic()
        assert read_all(s) == b""  # no answer to a request never sent: it could be taken for the next one's
        assert time.monotonic() - t0 < HEADER_S + SLACK_S


def test_a_kept_alive_connection_gets_a_new_deadline_per_request(daemon):
    body = json.dumps(SHORT).encode()
    with connect(daemon) as s:
        s.sendall(PARTIAL + f"content-length: {len(body)}\r\n\r\n".encode() + body)
        first = b""
        while b'"usage"' not in first:
            first += s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        time.sleep(HEADER_S * 0.8)  # idle between requests: the keep-alive timeout's business
        s.sendall(PARTIAL)
        t0 = time.monotonic()
        assert_error_json(read_all(s), 408, "request_timeout")
        assert time.monotonic() - t0 < HEADER_S + SLACK_S


@pytest.mark.parametrize("trickle", [False, True])
def test_a_body_that_stops_or_trickles_gets_408(daemon, trickle):
    """A total deadline: a byte every 0.1 s does not extend it; and the 408 is not lost to a reset
    although the client is still sending when the server answers."""
    with connect(daemon) as s:
        s.sendall(PARTIAL + b"content-length: 100000\r\n\r\n" + b'{"prompt": "hel')
        t0 = time.monotonic()
        raw = b""
        while True:
            readable, _, _ = select.select([s], [], [], 0.1)
            if readable:
                part = s.recv(65536)
                raw += part
                if not part:
                    break
            elif trickle:
                s.sendall(b"l")
        took = time.monotonic() - t0
    assert_error_json(raw, 408, "request_timeout")
    assert BODY_S * 0.9 < took < BODY_S + SLACK_S
    ok(daemon)


def test_garbage_gets_a_json_400_without_a_traceback(daemon):
    for junk in (b"GARBAGE\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40),
                 b"GET / HTTP/1.1\r\nbad header line\r\n\r\n"):
        with connect(daemon) as s:
            s.sendall(junk)
            raw = read_all(s)
        assert_error_json(raw, 400, "invalid_http_request")
    ok(daemon)
    no_traceback(daemon)


def test_an_upgrade_request_is_answered_as_plain_http(daemon):
    """uvicorn would hand a WebSocket upgrade to its own WebSocket layer (plain-text refusals) where
    a WebSocket library is installed; the daemon has no WebSocket routes and turns that layer off."""
    with connect(daemon) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: websocket\r\n"
                  b"sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        raw = b""
        while b"max_model_len" not in raw:
            raw += s.recv(65536)
    status, headers, body = response(raw)
    assert status == 200 and headers["content-type"] == "application/json"
    assert body["data"][0]["max_model_len"] == 256


# ---- the connection cap ---------------------------------------------------------------------------
def test_at_the_cap_idle_connections_make_room_and_busy_ones_get_a_json_503(tiny_model_dir):
    cap = 3
    with DaemonProcess("--model", str(tiny_model_dir), "--max-model-len", "2048", "--max-connections", str(cap),
                       "--http-header-timeout", "30") as d:
        idle = [connect(d) for _ in range(cap)]
        time.sleep(0.2)
        assert_status(d, 503)  # new connections are within their grace to send a request: none is evicted
        time.sleep(EVICT_GRACE_S)
        ok(d)  # now silent past the grace: the oldest idle connection made room
        idle[0].settimeout(5)
        assert idle[0].recv(100) == b""
        idle[0].close()
        for s in idle[1:]:
            s.setblocking(False)
            with pytest.raises(BlockingIOError):  # still open, nothing to read
                s.recv(100)
            s.close()
        time.sleep(0.2)
        # every connection busy with a stream: a new request is told to come back
        long = {"prompt": "Once upon a time", "max_tokens": 2000, "stream": True, "ignore_eos": True}
        with httpx.Client(base_url=d.url, timeout=30, limits=httpx.Limits(max_connections=cap + 1)) as c:
            streams = [c.stream("POST", "/v1/completions", json=long) for _ in range(cap)]
            lines = []
            for st in streams:
                r = st.__enter__()
                assert r.status_code == 200
                lines.append(r.iter_lines())
                next(lines[-1])
            with connect(d) as s:
                body = json.dumps(SHORT).encode()
                s.sendall(PARTIAL + f"content-length: {len(body)}\r\n\r\n".encode() + body)
                headers = assert_error_json(read_all(s), 503, "too_many_connections")
                assert headers["retry-after"] == "1"
            for st in streams:
                st.__exit__(None, None, None)
        time.sleep(0.5)
        ok(d)  # recovered
        assert '"event":"connection_cap"' in d.log()
    no_traceback(d)


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def test_a_low_descriptor_limit_is_warned_about_and_slowloris_never_resets_a_client(tiny_model_dir):
    """The issue's case: under a limit of 256 descriptors, 300 slowloris connections made new
    requests fail with ECONNRESET. Now the slow ones make room for the new ones."""
    with DaemonProcess("--model", str(tiny_model_dir), "--max-model-len", "256", "--http-header-timeout", "30",
                       preexec_fn=_low_nofile) as d:
        line = next(x for x in d.log().splitlines() if '"event":"descriptor_limit_low"' in x)
        warning = json.loads(line)
        assert warning["nofile"] == 256 and warning["max_connections"] < warning["wanted_connections"]
        assert "LimitNOFILE" in warning["hint"]
        socks = []
        for _ in range(300):
            socks.append(connect(d))
            socks[-1].sendall(PARTIAL)
        time.sleep(EVICT_GRACE_S + 0.2)  # past the grace a new connection gets, they are slowloris
        for _ in range(5):
            ok(d)
        with httpx.Client(base_url=d.url, timeout=30) as c:
            assert c.get("/health").status_code == 200
        answered = dropped = 0
        for s in socks:
            s.setblocking(False)
            try:
                raw = s.recv(65536)
            except BlockingIOError:
                continue  # still served: waiting for the rest of its headers
            except ConnectionResetError:
                dropped += 1  # past the descriptor ceiling: closed at once, unanswered
                continue
            if not raw:
                dropped += 1
                continue
            answered += 1  # evicted past its grace, or over the cap: told why
            assert_error_json(raw + read_rest(s), 408, "request_timeout")
        assert answered >= 5 and answered + dropped >= 300 - warning["max_connections"]
        for s in socks:
            s.close()
    no_traceback(d)


def read_rest(s: socket.socket) -> bytes:
    s.setblocking(True)
    s.settimeout(5)
    return read_all(s)
