"""The trace-record file: a SpanExporter that appends one OTLP/JSON `TracesData` line per export
batch to a JSONL file, and rotates it by size (FILE -> FILE.1 -> ... -> FILE.N, the oldest
dropped), so a daemon that runs for weeks keeps a bounded amount of history on disk. At 256
streams the engine-step spans alone (a link and a request id per row) write about 2.6 MB/s, so the
default 64 MiB x 5 files hold a few minutes of peak load; --trace-file-max-mb and
--trace-file-backups size it.

It runs on the batch processor's worker thread, never on the event loop or the GPU thread."""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from pegainfer.telemetry import otlp_json

MAX_BYTES = 64 << 20  # rotate once the file would grow past this
BACKUPS = 4  # rotated files kept beside the live one

log = logging.getLogger("pegainfer.telemetry")


class JsonlSpanExporter(SpanExporter):
    def __init__(self, path: str | os.PathLike, *, max_bytes: int = MAX_BYTES, backups: int = BACKUPS,
                 dumps: otlp_json.Dumps = otlp_json.stdlib_dumps) -> None:
        if max_bytes < 1 or backups < 0:
            raise ValueError(f"max_bytes must be >= 1 and backups >= 0, got {max_bytes}, {backups}")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self.dumps = dumps  # the JSON encoder (the daemon's: orjson)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = open(self.path, "ab")
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            record = otlp_json.line(spans, self.dumps)
        except Exception:  # noqa: BLE001 - a span that cannot be encoded must not kill the exporter thread
            log.exception("trace records: could not encode %d spans", len(spans))
            return SpanExportResult.FAILURE
        with self._lock:
            if self._closed:
                return SpanExportResult.FAILURE
            try:
                size = self._file.tell()
                if size > 0 and size + len(record) > self.max_bytes:
                    self._rotate()
                self._file.write(record)
                self._file.flush()
            except OSError:
                log.exception("trace records: could not write %s", self.path)
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def _rotate(self) -> None:
        """FILE -> FILE.1 -> ... -> FILE.N; readers (tools/traceview/reader.py) read the whole chain."""
        log.info("trace records: %s reached %d MiB; rotating (%d kept)", self.path, self.max_bytes >> 20, self.backups)
        self._file.close()
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        else:
            for n in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{n}")
                if older.exists():
                    older.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._file = open(self.path, "ab")

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            if not self._closed:
                self._file.flush()
                os.fsync(self._file.fileno())
        return True

    def shutdown(self) -> None:
        with self._lock:
            if not self._closed:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
                self._closed = True
