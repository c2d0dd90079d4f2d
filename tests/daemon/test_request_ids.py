"""X-Request-Id: the caller's id names the request (its response, its chunks, the cancel route, the
scheduler and the trace) when it is sane; anything else is ignored for a fresh id. A caller's id that
is live already goes to the new request with a random suffix, so that the live one keeps its id and
a cancel with it still reaches it. The table of live ids frees an id when its requests end."""
from __future__ import annotations

import json

import pytest

from pegainfer.daemon.request_ids import MAX_ID_CHARS, SWEEP_AT, RequestIds, caller_id
from pegainfer.lifecycle.states import RequestState
from tests.daemon.inprocess import InProcessDaemon
from tests.lifecycle.fakes import make_request


@pytest.mark.parametrize("value", ["abc", "req-0001", "0f8fad5b-d9cb-469f-a165-70867728950e", "a" * MAX_ID_CHARS,
                                   "x:y@z+1=2~_.!$&'()*,;[]{}|^`<>"])
def test_sane_ids_are_taken(value):
    assert caller_id({"x-request-id": value}) == value


@pytest.mark.parametrize("value", ["", "a" * (MAX_ID_CHARS + 1), "has space", "tab\there", "new\nline", "caf\u00e9",
                                   "a/b", "a?b", "a#b", "50%", 'q"uote', "back\\slash", "\x7f", "\x00"])
def test_other_ids_are_ignored(value):
    assert caller_id({"x-request-id": value}) is None
    assert caller_id({}) is None


def test_a_live_id_is_never_given_twice():
    ids = RequestIds()
    first, [e1] = ids.claim("dup", "cmpl-", 1, lambda x: False)
    assert (first, e1) == ("dup", "dup")
    second, _ = ids.claim("dup", "cmpl-", 1, lambda x: False)
    assert second.startswith("dup-") and len(second) == len("dup-") + 8
    third, parts = ids.claim("dup", "cmpl-", 3, lambda x: False)
    assert third not in (first, second) and parts == [f"{third}-{i}" for i in range(3)]
    # an id the scheduler holds (a request made elsewhere), or one a group's parts would take
    other, _ = ids.claim("held", "cmpl-", 1, lambda x: x == "held")
    assert other.startswith("held-")
    grouped, _ = ids.claim("g", "cmpl-", 2, lambda x: x == "g-1")
    assert grouped.startswith("g-") and grouped != "g-1"
    fresh, _ = ids.claim(None, "chatcmpl-", 1, lambda x: False)
    assert fresh.startswith("chatcmpl-") and len(fresh) == len("chatcmpl-") + 32


def test_an_id_is_free_once_released_or_once_its_requests_ended():
    ids = RequestIds()
    rid, _ = ids.claim("a", "cmpl-", 1, lambda x: False)
    ids.release(rid)
    assert ids.claim("a", "cmpl-", 1, lambda x: False)[0] == "a"
    request = make_request("a")
    ids.bind("a", [request])
    assert ids.requests("a") == (request,)
    request.state = RequestState.CANCELLED  # ended without a release (a response never written)
    assert ids.requests("a") is None and ids.claim("a", "cmpl-", 1, lambda x: False)[0] == "a"


def test_ended_ids_are_swept_as_the_table_grows():
    ids = RequestIds()
    for i in range(3 * SWEEP_AT):
        rid, _ = ids.claim(f"r{i}", "cmpl-", 1, lambda x: False)
        request = make_request(rid)
        ids.bind(rid, [request])
        request.state = RequestState.FINISHED
    assert len(ids) <= SWEEP_AT + 1


@pytest.fixture(scope="module")
def daemon(tiny_model_dir):
    with InProcessDaemon(tiny_model_dir, max_active=4, max_model_len=256) as d:
        yield d


def test_the_callers_id_names_the_request_everywhere(daemon):
    r = daemon.client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3, "stream": True},
                           headers={"X-Request-Id": "trace-me-42"})
    assert r.headers["x-request-id"] == "trace-me-42"
    chunks = [json.loads(e[6:]) for e in r.text.split("\n\n") if e.startswith("data: {")]
    assert {c["id"] for c in chunks} == {"trace-me-42"}
    assert daemon.client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3},
                              headers={"X-Request-Id": "trace-me-43"}).json()["id"] == "trace-me-43"


@pytest.mark.parametrize("bad", ["a" * 129, "with space", "caf\u00e9".encode(), "a/b"])
def test_an_insane_id_is_replaced_by_a_fresh_one(daemon, bad):
    r = daemon.client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 1}, headers={"X-Request-Id": bad})
    assert r.status_code == 200 and r.headers["x-request-id"].startswith("cmpl-") and r.json()["id"].startswith("cmpl-")


def test_a_duplicate_of_a_live_id_gets_a_suffix_and_cancel_reaches_the_first(daemon):
    body = {"prompt": "Hello", "max_tokens": 200, "stream": True, "ignore_eos": True}
    with daemon.client.stream("POST", "/v1/completions", json=body, headers={"X-Request-Id": "dup"}) as first:
        lines = first.iter_lines()
        assert first.headers["x-request-id"] == "dup" and next(lines).startswith("data: ")
        second = daemon.client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                                    headers={"X-Request-Id": "dup"})
        assert second.status_code == 200
        twin = second.headers["x-request-id"]
        assert twin.startswith("dup-") and second.json()["id"] == twin
        assert daemon.rt.scheduler.get("dup") is not None  # the first runs on, under its own id
        assert daemon.client.post("/v1/completions/dup/cancel").status_code == 200
        rest = [line for line in lines if line.startswith("data: ")]
    assert json.loads(rest[-2][6:])["error"]["code"] == "request_cancelled" and rest[-1] == "data: [DONE]"
    assert daemon.client.post(f"/v1/completions/{twin}/cancel").status_code == 404  # it had finished
    assert daemon.client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1},
                              headers={"X-Request-Id": "dup"}).headers["x-request-id"] == "dup"  # free again


def test_a_list_of_prompts_under_the_callers_id(daemon):
    r = daemon.client.post("/v1/completions", json={"prompt": ["a", "b"], "max_tokens": 2},
                           headers={"X-Request-Id": "batch-7"})
    assert r.status_code == 200 and r.json()["id"] == "batch-7" and len(r.json()["choices"]) == 2
    assert len(daemon.rt.request_ids) == 0  # every response ended: no id is held
