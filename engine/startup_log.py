"""Structured start-up and shutdown log lines: one JSON object per message on the pegainfer logger
(an "event" name, then the fields); the daemon's log formatter (telemetry/logs.py) renders them as
the fields of the line, after its timestamp, level and logger."""
from __future__ import annotations

import logging

import orjson

log = logging.getLogger("pegainfer.engine")


def log_event(event: str, *, level: str = "info", **fields) -> None:
    """`level`: the record's level by name (info, warning, error)."""
    log.log(logging.getLevelNamesMapping()[level.upper()], orjson.dumps({"event": event, **fields}).decode())
