"""The SSE bytes of one streamed completion's chunks, with the parts that never change encoded once
per request: `data: {"id":…,"object":"text_completion","created":…,"model":…,"choices":[` in front,
`]}` and the blank line behind, and each choice's `{"index":i,"text":` opening. Per chunk only the
text (and, when asked for, the log-probs and the finish reason) is encoded.

The bytes are exactly what orjson.dumps makes of daemon.protocol.chunk's dict (orjson writes
compact JSON with keys in insertion order), so a client cannot tell the two apart; a test pins it."""
from __future__ import annotations

import orjson

from pegainfer.daemon import protocol
from pegainfer.daemon.choice import Delta
from pegainfer.daemon.logprobs import as_openai

_TAIL = b"]}\n\n"
_NO_LOGPROBS = b',"logprobs":null,"finish_reason":'
_FINISH = {None: b"null}", "stop": b'"stop"}', "length": b'"length"}'}


class ChunkEncoder:
    __slots__ = ("head", "logprobs", "_openings")

    def __init__(self, request_id: str, created: int, model: str, logprobs: bool) -> None:
        frame = orjson.dumps(protocol.chunk(request_id, created, model, []))  # ...,"choices":[]}
        self.head = b"data: " + frame[:-2]  # up to and including "choices":[
        self.logprobs = logprobs
        self._openings: dict[int, bytes] = {}

    def chunk(self, index: int, d: Delta) -> bytes:
        """One SSE event: a chunk with choice `index`'s delta."""
        if self.logprobs:  # rare and bulky: the generic encoding
            choice = {"index": index, "text": d.text, "logprobs": as_openai(d.entries),
                      "finish_reason": d.finish_reason}
            return self.head + orjson.dumps(choice) + _TAIL
        opening = self._openings.get(index)
        if opening is None:
            opening = self._openings[index] = b'{"index":%d,"text":' % index
        finish = _FINISH.get(d.finish_reason) or orjson.dumps(d.finish_reason) + b"}"
        return b"".join((self.head, opening, orjson.dumps(d.text), _NO_LOGPROBS, finish, _TAIL))
