"""ep/'s structured log lines: one JSON object per line on the `pegainfer.ep` logger, in the same
form as the engine's start-up lines (an "event" name, then the fields), so that the daemon's
start-up progress, the tests and tools/reliakit read expert-rank events (`expert_rank_ready`,
`expert_rank_joined`, ...) the way they read the engine's."""
from __future__ import annotations

import logging

import orjson

LOGGER = "pegainfer.ep"
log = logging.getLogger(LOGGER)


def log_event(event: str, **fields) -> None:
    log.info(orjson.dumps({"event": event, **fields}).decode())
