"""Request fields this server does not know: accepted and ignored, as vLLM does, but each name is
logged once per process at warning level, so that an operator learns that a client relies on
something that has no effect here.

Bounded, because the names come from clients: a name is cut to MAX_NAME_CHARS and escaped before it
is remembered or logged, and once MAX_NAMES distinct names were logged, one last line says so and
no more are remembered (a hostile client sending a new name with every request cannot grow memory or
flood the log)."""
from __future__ import annotations

import logging
from collections.abc import Iterable

log = logging.getLogger("pegainfer.daemon")

MAX_NAMES = 256
MAX_NAME_CHARS = 64


class UnknownFields:
    def __init__(self, max_names: int = MAX_NAMES) -> None:
        self.max_names = max_names
        self.seen: set[tuple[str, str]] = set()  # (route, name as logged)
        self.full = False

    def note(self, route: str, body: object, known: Iterable[str] | frozenset[str]) -> list[str]:
        """Log the fields of `body` (a request's JSON object) that `known` does not name, each the
        first time it is seen on `route`; returns the unknown names of this body (as logged)."""
        if not isinstance(body, dict):
            return []
        unknown = [_shown(name) for name in body if name not in known]
        for name in unknown:
            key = (route, name)
            if key in self.seen or self.full:
                continue
            if len(self.seen) >= self.max_names:
                self.full = True
                log.warning("more than %d distinct unknown request fields seen; no more are logged", self.max_names)
                continue
            self.seen.add(key)
            log.warning("ignoring unknown field %s in %s requests (logged once per field)", name, route)
        return unknown


def _shown(name: object) -> str:
    """The name cut to MAX_NAME_CHARS and quoted with escapes (no control characters reach the log)."""
    text = str(name)
    cut = text[:MAX_NAME_CHARS]
    return ascii(cut) + ("..." if len(text) > MAX_NAME_CHARS else "")
