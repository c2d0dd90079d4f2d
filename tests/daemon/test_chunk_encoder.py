"""daemon.chunk_encoder: the pre-encoded chunk bytes equal orjson's encoding of protocol.chunk's dict."""
from __future__ import annotations

import orjson
import pytest

from pegainfer.daemon import protocol
from pegainfer.daemon.choice import Delta
from pegainfer.daemon.chunk_encoder import ChunkEncoder
from pegainfer.daemon.logprobs import LogprobEntry, as_openai

DELTAS = [Delta("hello"), Delta(""), Delta(' "quoted"\n\\ \u00e9\u65e5\U0001f600 \x00\x1f'), Delta("x", [], "stop"),
          Delta("", [], "length"), Delta("y", [], "abort")]
ENTRIES = [LogprobEntry(" a", -0.5, {" a": -0.5, " b": -1.25}, 0), LogprobEntry("b", None, None, 2)]


@pytest.mark.parametrize("logprobs", [False, True])
@pytest.mark.parametrize("index", [0, 3])
def test_bytes_equal_the_generic_encoding(logprobs, index):
    rid, created, model = "cmpl-18f0a\"b", 1764700000, "deepseek-v2-lite/ü"
    enc = ChunkEncoder(rid, created, model, logprobs)
    for d in DELTAS + [Delta("t", ENTRIES, None), Delta("", ENTRIES, "stop")]:
        if d.entries and not logprobs:
            continue
        choice = {"index": index, "text": d.text, "logprobs": as_openai(d.entries) if logprobs else None,
                  "finish_reason": d.finish_reason}
        want = b"data: " + orjson.dumps(protocol.chunk(rid, created, model, [choice])) + b"\n\n"
        assert enc.chunk(index, d) == want
