"""The process's log lines: one JSON object per line, each with `timestamp` (RFC 3339, UTC), `level`
and `logger` first, uvicorn's lines and Python warnings included, formatted by python-json-logger.

A record whose message is one JSON object (the structured events of engine/startup_log.py and
ep/log.py: `{"event": "serving", ...}`) is rendered as that object's fields after those three, so
that an event reads `{"timestamp":...,"level":"INFO","logger":"pegainfer.engine","event":"serving",
"host":...}`; any other record gets its text as `message`, and its `extra` fields. An exception is
one field, `exception` (the traceback as a string), never lines of its own; an uncaught one in the
main thread or another thread is logged the same way (it remains a bug)."""
from __future__ import annotations

import json
import logging
import sys
import threading
from typing import Any, TextIO

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.orjson import OrjsonFormatter

FIRST = ("timestamp", "level", "logger")
UVICORN_EXTRAS = ("color_message",)  # uvicorn's ANSI-coloured copy of a message


class JsonLines(OrjsonFormatter):
    """The one formatter: compact JSON (orjson), `timestamp`/`level`/`logger` first."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s %(message)s", timestamp=True,
                         rename_fields={"levelname": "level", "name": "logger", "exc_info": "exception",
                                        "stack_info": "stack"},
                         reserved_attrs=[*RESERVED_ATTRS, *UVICORN_EXTRAS])

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        out = {key: log_data.pop(key, None) for key in FIRST}
        fields = _event(log_data.get("message"))
        if fields is not None:
            del log_data["message"]
            log_data = {**fields, **log_data}
        for key, value in log_data.items():
            out[key if key not in out else key + "_"] = value  # a field never hides the first three
        return out


def _event(message: Any) -> dict[str, Any] | None:
    """The fields of a message that is one JSON object, else None."""
    if not (isinstance(message, str) and message.startswith("{") and message.endswith("}")):
        return None
    try:
        fields = json.loads(message)
    except ValueError:
        return None
    return fields if isinstance(fields, dict) else None


def configure_logging(level: str | int = "info", stream: TextIO | None = None) -> logging.Handler:
    """Route every logger of the process through one JSON-lines handler on `stream` (stderr): the
    root logger's only handler, at `level`; Python warnings and uncaught exceptions go there too."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonLines())
    logging.basicConfig(level=level.upper() if isinstance(level, str) else level, handlers=[handler], force=True)
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_thread_uncaught
    return handler


def _log_uncaught(kind, value, tb) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, tb)
        return
    logging.getLogger("pegainfer").critical("uncaught exception", exc_info=(kind, value, tb))


def _log_thread_uncaught(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("pegainfer").critical("uncaught exception in thread %s", name,
                                            exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

