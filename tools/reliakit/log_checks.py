"""What the daemons' own logs must not hold: a Python traceback is a bug wherever it comes from (an
unhandled exception in a request, uvicorn's "Exception in ASGI application", a rank's crash), so
the run fails on any, naming the log, the line and the first lines of each."""
from __future__ import annotations

import json
from pathlib import Path

from tools.reliakit.check import Check, verdict

MARKER = "Traceback (most recent call last)"
# keys under which a structured (JSON) log line carries an exception's stack
JSON_STACK_KEYS = ("exc_info", "exception", "stack_info", "stack")
SHOWN_LINES = 4


def tracebacks(path: Path) -> list[str]:
    """Each traceback in one log, as 'file:line: first lines'."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for i, line in enumerate(lines):
        if MARKER in line or _json_stack(line):
            shown = " | ".join(x.strip() for x in lines[i:i + SHOWN_LINES])
            found.append(f"{path.name}:{i + 1}: {shown[:400]}")
    return found


def _json_stack(line: str) -> bool:
    if not line.startswith("{"):
        return False
    try:
        obj = json.loads(line)
    except ValueError:
        return False
    return isinstance(obj, dict) and any(obj.get(k) for k in JSON_STACK_KEYS)


def no_tracebacks(logs: list[Path]) -> Check:
    problems = [t for p in logs for t in tracebacks(p)]
    return verdict("no_tracebacks", problems, f"no traceback in {len(logs)} daemon log(s)",
                   {"logs": [str(p) for p in logs]})
