"""Structured start-up and shutdown log lines: one JSON object per line on the pegainfer logger."""
from __future__ import annotations

import logging

import orjson

log = logging.getLogger("pegainfer.engine")


def log_event(event: str, **fields) -> None:
    log.info(orjson.dumps({"event": event, **fields}).decode())
