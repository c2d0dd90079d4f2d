"""Renders pegainfer trace records (OTLP/JSON lines) for a person:

    python tools/trace_view.py TRACE.jsonl --out FILE [--format html|perfetto] [--reason REASON]
                               [--since ISO --until ISO]

TRACE.jsonl is the daemon's --trace-file (or a URL of a daemon's /debug/traces). html writes one
self-contained page (no network): a waterfall per request and the engine steps they shared.
perfetto writes Chrome trace-event JSON for ui.perfetto.dev or chrome://tracing. --reason (may be
repeated or comma-separated) keeps requests with that terminal reason; --since/--until keep those
that overlap the window (ISO 8601; a time without a zone is UTC). Bad input prints one line on
stderr and exits 2."""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import NoReturn

if __package__ in (None, ""):  # run as a script: make the repository's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pegainfer.engine.contract import TerminalReason  # noqa: E402
from tools.traceview import page, perfetto, reader  # noqa: E402

PROG = "trace_view"
REASONS = tuple(r.value for r in TerminalReason)


def _reasons(text: str) -> list[str]:
    """--reason's value: comma-separated terminal reasons, each one the trace knows."""
    reasons = [r for r in text.split(",") if r]
    if unknown := [r for r in reasons if r not in REASONS]:
        raise argparse.ArgumentTypeError(f"{', '.join(map(repr, unknown))} is not a terminal reason (one of "
                                         f"{', '.join(REASONS)})")
    return reasons


def fail(message: str) -> NoReturn:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(2)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(message)


def parse_time(text: str) -> int:
    """ISO 8601 -> epoch nanoseconds (naive times are UTC)."""
    try:
        t = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        fail(f"not an ISO 8601 time: {text!r}")
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    return round(t.timestamp() * 1e6) * 1000


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog=PROG, description="Render pegainfer trace records (OTLP/JSON lines) as HTML or Perfetto JSON.")
    p.add_argument("trace", help="trace JSONL file, or a URL of a daemon's /debug/traces")
    p.add_argument("--out", required=True, help="output file")
    p.add_argument("--format", choices=("html", "perfetto"), default="html")
    p.add_argument("--reason", action="append", default=[], type=_reasons, metavar="REASON[,REASON]",
                   help=f"keep only these terminal reasons (repeatable; of {', '.join(REASONS)})")
    p.add_argument("--since", help="keep requests that end at or after this ISO time")
    p.add_argument("--until", help="keep requests that start at or before this ISO time")
    args = p.parse_args(argv)
    since_ns = parse_time(args.since) if args.since else None
    until_ns = parse_time(args.until) if args.until else None
    try:
        spans = reader.load(args.trace)
    except (OSError, ValueError, KeyError) as e:
        fail(f"{args.trace}: {e}")
    requests, steps = reader.build(spans)
    reasons = {r for item in args.reason for r in item}
    requests, steps = reader.select(
        requests, steps, reasons=reasons or None,
        since_ns=since_ns, until_ns=until_ns)
    out = Path(args.out)
    if args.format == "html":
        out.write_text(page.render(requests, steps, source=args.trace))
    else:
        out.write_text(json.dumps(perfetto.render(requests, steps)))
    print(f"{out}: {len(requests)} requests, {len(steps)} engine steps ({args.format})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
