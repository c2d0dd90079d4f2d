"""The trace viewer behind tools/trace_view.py, and the trace-record reader the bench and reliability
tools share: reader.py (OTLP/JSON lines, from the daemon's trace file and its rotated files or a
/debug/traces URL, into span records and the viewer's request and step model), page.py and
assets.py (one self-contained HTML page), perfetto.py (Chrome trace-event JSON). Standard library
only, so it runs wherever a trace file is copied; the daemon itself never reads its records back."""
