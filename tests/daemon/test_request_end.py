"""What a client is told about a request that did not finish: a stable message and code, never the
engine's own text (source paths, peer addresses, exception names), which goes to the log instead."""
from __future__ import annotations

import json
import logging

import pytest

from pegainfer.daemon.request_end import ENGINE_FAILED_MESSAGE, SERVER_SHUTDOWN, end_error, engine_failure
from pegainfer.lifecycle.sink import SinkEnd
from pegainfer.lifecycle.states import RequestState, TerminalReason

GLOO = ("engine failed: RankFailure: expert rank 1 exited (signal SIGKILL) during combine "
        "[[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:61835: Connection reset]")
LEAKS = ("pair.cc", "gloo", "127.0.0.1", "61835", "RankFailure", "third_party", "SIGKILL")


def failed(message: str) -> SinkEnd:
    return SinkEnd(RequestState.FAILED, TerminalReason.FAILED, message=message)


def test_an_engine_failure_names_the_rank_and_nothing_else(caplog):
    with caplog.at_level(logging.INFO, logger="pegainfer"):
        e = end_error("cmpl-1", failed(GLOO))
    assert (e.status, e.type, e.code) == (500, "server_error", "engine_failed")
    assert "expert rank 1 failed" in e.message and not any(leak in e.message for leak in LEAKS), e.message
    [record] = [r for r in caplog.records if "request_failed" in r.getMessage()]
    assert json.loads(record.getMessage()) == {"event": "request_failed", "request_id": "cmpl-1", "error": GLOO}
    assert record.levelname == "ERROR"  # a failed request is an error in the log, as the engine's death is


@pytest.mark.parametrize("detail,expected", [
    ("expert rank(s) 1, 3 did not complete dispatch within 10 s [Timed out in /src/x.cpp:88]",
     "expert ranks 1, 3 failed"),
    ("expert rank 2 exited (exit code 1) during dispatch; expert rank 1 exited (signal 9) during dispatch",
     "expert ranks 1, 2 failed"),
    ("ValueError: Overflow when unpacking long long", ENGINE_FAILED_MESSAGE),
    ("engine protocol error: finish in state PREFILL, before any token", ENGINE_FAILED_MESSAGE),
    ("RuntimeError: CUDA error: an illegal memory access was encountered at /opt/torch/c10/cuda.cpp:43",
     ENGINE_FAILED_MESSAGE),
    (None, ENGINE_FAILED_MESSAGE),
])
def test_engine_failure_messages_are_stable(detail, expected):
    message = engine_failure(detail)
    assert message.startswith(expected)
    assert "/" not in message and ".cpp" not in message and "Error" not in message


def test_cancellations_keep_the_servers_words_and_take_their_code():
    shutdown = end_error("r", SinkEnd(RequestState.CANCELLED, TerminalReason.CANCELLED,
                                      message="server shutting down (forced stop)", code=SERVER_SHUTDOWN))
    assert (shutdown.status, shutdown.type, shutdown.code) == (503, "service_unavailable", "server_shutdown")
    assert shutdown.message == "server shutting down (forced stop)"
    api = end_error("r", SinkEnd(RequestState.CANCELLED, TerminalReason.CANCELLED, message="cancelled by API request"))
    from pegainfer.lifecycle.scheduler import SLOW_READER, SLOW_READER_CODE
    slow = end_error("r", SinkEnd(RequestState.CANCELLED, TerminalReason.CANCELLED, message=SLOW_READER,
                                  code=SLOW_READER_CODE))
    assert (slow.status, slow.code) == (503, SLOW_READER_CODE)  # the server's cancel: the caller may retry
    # not a 5xx, which the OpenAI SDKs retry (they would run the cancelled request again)
    assert (api.status, api.code, api.message) == (499, "request_cancelled", "cancelled by API request")
    gone = end_error("r", SinkEnd(RequestState.DISCONNECTED, TerminalReason.DISCONNECTED))
    assert (gone.status, gone.code, gone.message) == (499, "client_disconnected", "disconnected")
