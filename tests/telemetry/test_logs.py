"""The JSON-lines log format (telemetry/logs.py): timestamp, level and logger first; an event message
becomes its fields; an exception is one field; uvicorn's coloured copy is dropped; configure_logging
routes warnings and uncaught exceptions of any thread through it, and the engine's events keep their
level."""
from __future__ import annotations

import datetime
import io
import json
import logging
import sys
import threading
import warnings

import pytest

from pegainfer.engine.startup_log import log_event
from pegainfer.telemetry.logs import JsonLines, configure_logging


def fmt(record: logging.LogRecord) -> dict:
    text = JsonLines().format(record)
    assert "\n" not in text
    return json.loads(text)


def record(msg: str, *args, level: int = logging.INFO, name: str = "pegainfer.x", exc_info=None,
           **extra) -> logging.LogRecord:
    r = logging.LogRecord(name, level, __file__, 1, msg, args, exc_info)
    r.__dict__.update(extra)
    return r


def test_a_plain_line_has_timestamp_level_logger_then_message_and_extras():
    line = fmt(record("hello %s", "world", level=logging.WARNING, name="uvicorn.error", color_message="\x1b[1mhi",
                      request_id="cmpl-1"))
    assert list(line) == ["timestamp", "level", "logger", "message", "request_id"]
    assert (line["level"], line["logger"], line["message"]) == ("WARNING", "uvicorn.error", "hello world")
    assert datetime.datetime.fromisoformat(line["timestamp"]).utcoffset() == datetime.timedelta(0)


def test_an_event_message_becomes_the_fields_of_the_line():
    line = fmt(record('{"event":"serving","port":8000,"level":"shadow","logger":"x"}'))
    assert line["event"] == "serving" and line["port"] == 8000 and "message" not in line
    assert line["level"] == "INFO" and line["logger"] == "pegainfer.x"  # a field never hides the first three
    assert line["level_"] == "shadow" and line["logger_"] == "x"
    assert fmt(record("{not json}"))["message"] == "{not json}"
    assert fmt(record("[1, 2]"))["message"] == "[1, 2]"


def test_an_exception_is_one_field_not_lines():
    try:
        raise ValueError("boom")
    except ValueError:
        line = fmt(record("it failed", level=logging.ERROR, exc_info=sys.exc_info()))
    assert line["message"] == "it failed"
    assert "Traceback" in line["exception"] and "ValueError: boom" in line["exception"]


def test_log_event_level_is_the_records_level(caplog):
    caplog.set_level(logging.INFO, logger="pegainfer")
    log_event("descriptor_limit_low", level="warning", nofile=256)
    [r] = [r for r in caplog.records if "descriptor_limit_low" in r.getMessage()]
    assert r.levelno == logging.WARNING
    assert fmt(r)["level"] == "WARNING" and fmt(r)["nofile"] == 256 and "level_" not in fmt(r)


@pytest.fixture
def configured():
    """configure_logging on a buffer, with the process's logging and hooks restored afterwards."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, sys.excepthook, threading.excepthook)
    stream = io.StringIO()
    try:
        configure_logging("info", stream)
        yield stream
    finally:
        logging.captureWarnings(False)
        root.handlers[:], sys.excepthook, threading.excepthook = saved[0], saved[2], saved[3]
        root.setLevel(saved[1])


def test_configure_logging_routes_warnings_and_uncaught_exceptions(configured):
    logging.getLogger("uvicorn.error").info("Started server process [%d]", 42)
    logging.getLogger("pegainfer.debugging").debug("not at info")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("careful", UserWarning, stacklevel=1)

    def crash():
        raise RuntimeError("thread died")
    t = threading.Thread(target=crash, name="gpu-thread")
    t.start()
    t.join()
    try:
        raise KeyError("main")
    except KeyError:
        sys.excepthook(*sys.exc_info())
    lines = [json.loads(x) for x in configured.getvalue().splitlines()]
    assert [x["logger"] for x in lines] == ["uvicorn.error", "py.warnings", "pegainfer", "pegainfer"]
    assert lines[0]["message"] == "Started server process [42]"
    assert "careful" in lines[1]["message"] and lines[1]["level"] == "WARNING"
    assert lines[2]["level"] == "CRITICAL" and "gpu-thread" in lines[2]["message"]
    assert "RuntimeError: thread died" in lines[2]["exception"]
    assert "KeyError: 'main'" in lines[3]["exception"]
