"""bench_serving --client raw (tools/benchkit/raw_client.py): the same records, metrics and failure
handling as the httpx client against the same fake server, over one kept-alive connection per
worker; a character cut between two HTTP chunks still decodes; https is refused in one line."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.tools.bench_fakes import FAIL_DELAY_S, KEY, TOKENS, bench, fake_server  # noqa: F401
from tools import bench_serving
from tools.benchkit.raw_client import RawConnection, send_raw


def test_raw_client_counts_failures_as_the_httpx_client_does(fake_server, tmp_path):  # noqa: F811
    r = bench(tmp_path, "--base-url", fake_server, "--profile", "short", "--model", "flaky", "--concurrency", "1,3",
              "--num-requests", "9", "--warmup", "0", "--max-tokens", "4", "--client", "raw")
    assert r["workload"]["client"] == "raw"
    errors = []
    for lv in r["levels"]:
        m = lv["runs"][0]["metrics"]
        assert (m["num_requests"], m["completed"], m["failed"], m["timed_out"]) == (9, 6, 3, 0)
        assert m["total_output_tokens"] == 6 * TOKENS and m["total_input_tokens"] == 6 * 64
        assert m["p99_e2el_ms"] < FAIL_DELAY_S * 1e3 * 0.8
        errors += lv["runs"][0]["errors"]
        ids = lv["runs"][0]["request_ids"]
        assert len(ids) == 9 and sum(i is None for i in ids) == 1  # the HTTP 500 carried no id
    assert any("HTTP 500: engine fell over" in e for e in errors)
    assert any("error chunk: rank 1 failed" in e for e in errors)
    assert any("without data: [DONE]" in e for e in errors)
    assert "client raw" in (tmp_path / "report.md").read_text()


def test_raw_client_times_out_reads_ids_from_chunks_and_sends_the_key(fake_server, tmp_path, monkeypatch):  # noqa: F811
    r = bench(tmp_path, "--base-url", fake_server, "--profile", "short", "--model", "slow", "--concurrency", "2",
              "--num-requests", "2", "--warmup", "0", "--timeout", "0.5", "--client", "raw")
    m = r["levels"][0]["runs"][0]["metrics"]
    assert (m["completed"], m["failed"], m["timed_out"]) == (0, 2, 2)
    r = bench(tmp_path, "--base-url", fake_server, "--profile", "short", "--model", "steady", "--concurrency", "2",
              "--num-requests", "6", "--warmup", "1", "--max-tokens", "4", "--client", "raw")
    lv = r["levels"][0]
    m = lv["runs"][0]["metrics"]
    assert (m["completed"], m["failed"], m["total_output_tokens"]) == (6, 0, 6 * TOKENS)
    assert m["median_tpot_ms"] > 0 and all(i and i.startswith("steady-") for i in lv["runs"][0]["request_ids"])
    monkeypatch.setenv("PEGAINFER_API_KEY", KEY)
    r = bench(tmp_path, "--base-url", fake_server, "--profile", "short", "--model", "secured", "--concurrency", "1",
              "--num-requests", "2", "--warmup", "0", "--client", "raw")
    assert r["levels"][0]["runs"][0]["metrics"]["completed"] == 2
    r = bench(tmp_path, "--base-url", fake_server, "--profile", "short", "--model", "unicode", "--concurrency", "2",
              "--num-requests", "4", "--warmup", "0", "--client", "raw")
    assert r["levels"][0]["runs"][0]["metrics"]["completed"] == 4


def test_a_character_cut_between_chunks_decodes_and_the_connection_is_kept(tmp_path):
    event = ("data: " + json.dumps({"id": "x-1", "choices": [{"index": 0, "text": " caf\u00e9 \u2014 \U0001f642"}]},
                                  ensure_ascii=False)
             + "\n\n").encode()
    usage = b'data: {"id": "x-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}\n\n'
    cut = event.index("\U0001f642".encode()) + 2  # inside the emoji's four bytes
    parts = [event[:cut], event[cut:], usage, b"data: [DONE]\n\n"]
    served, state = [], {}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = int(next(line.split(b":")[1] for line in head.lower().split(b"\r\n")
                              if line.startswith(b"content-length")))
            served.append(json.loads(await reader.readexactly(length)))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for p in parts:
                writer.write(b"%x\r\n%s\r\n" % (len(p), p))
                await writer.drain()
                await asyncio.sleep(0.005)
            writer.write(b"0\r\n\r\n")
        writer.close()
        await writer.wait_closed()
        state["ended"].set()

    async def run():
        state["ended"] = asyncio.Event()
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conn = RawConnection(f"http://127.0.0.1:{port}")
        recs = [await send_raw(conn, "/v1/completions", {"n": i}, i, 5.0) for i in range(2)]
        conn.close()
        await asyncio.wait_for(state["ended"].wait(), 5)  # no handler left pending when the loop closes
        server.close()
        await server.wait_closed()
        return recs

    recs = asyncio.run(run())
    assert [r.ok for r in recs] == [True, True] and [r.error for r in recs] == [None, None]
    assert [len(r.chunk_times) for r in recs] == [1, 1] and recs[0].request_id == "x-1" and recs[0].output_tokens == 1
    assert served == [{"n": 0}, {"n": 1}]  # both over the one connection, in order


def test_raw_client_takes_http_urls_only(tmp_path, capsys):
    out = tmp_path / "r.json"
    try:
        bench_serving.main(["--base-url", "https://example.invalid", "--profile", "short", "--client", "raw",
                            "--out", str(out)])
    except SystemExit as e:
        assert e.code == 2
    assert "--client raw takes an http:// --base-url" in capsys.readouterr().err and not Path(out).exists()


def test_a_kept_alive_connection_closed_by_the_server_is_opened_again_once():
    """The server answers one request per connection and closes it without saying so: the next
    request on that connection meets EOF before any answer and goes out again on a new one."""
    body = (b'data: {"id": "k", "choices": [{"index": 0, "text": "a"}]}\n\n'
            b'data: {"id": "k", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}\n\n'
            b"data: [DONE]\n\n")
    state = {"connections": 0, "closed": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state["connections"] += 1
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.lower().split(b"\r\n")
                          if line.startswith(b"content-length")))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        state["closed"] += 1

    async def run():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        conn = RawConnection(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        recs = []
        for i in range(3):
            recs.append(await send_raw(conn, "/v1/completions", {"i": i}, i, 5.0))
            await asyncio.sleep(0.05)  # the server's close reaches the client before the next request
        conn.close()
        for _ in range(100):
            if state["closed"] == state["connections"]:
                break
            await asyncio.sleep(0.01)
        server.close()
        await server.wait_closed()
        return recs

    recs = asyncio.run(run())
    assert [r.ok for r in recs] == [True, True, True] and [r.output_tokens for r in recs] == [1, 1, 1]
    assert state["connections"] == 3
