"""Request ids: the caller's `X-Request-Id` when it is a sane one (as vLLM uses it), else a fresh
unguessable id; and the ids live now, so that a second request never takes a live one's id (the
cancel route, the scheduler and the traces all key on it).

A request's public id is the one its response carries (`id` in every chunk, `X-Request-Id`) and the
one the cancel route takes. A request of one prompt runs as one engine request under that id; a
request of P prompts runs as P engine requests `<id>-0` ... `<id>-<P-1>` (their traces carry those),
and cancelling the public id cancels them all.

A caller's id that is live already (a retry of a request still running, two clients choosing the
same id) is not refused: the new request gets the id with `-` and 8 random hex digits appended, and
its response says so in X-Request-Id and the chunks' `id`. The live request keeps its id, so a
cancel with it still reaches the request it was meant for."""
from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence

from pegainfer.daemon.protocol import completion_id
from pegainfer.lifecycle.request import Request

MAX_ID_CHARS = 128
# Printable ASCII without the space; less what would not survive a URL path (the cancel route takes
# the id as a path segment) or a JSON string unescaped.
_UNSAFE = frozenset('/?#%\\"')
SWEEP_AT = 1024  # ids remembered before the ended ones are swept out


def caller_id(headers: Mapping[str, str]) -> str | None:
    """The caller's X-Request-Id if it is 1-MAX_ID_CHARS printable ASCII characters with no space
    and none of / ? # % \\ \"; else None (a fresh id is made instead)."""
    value = headers.get("x-request-id")
    if not value or len(value) > MAX_ID_CHARS:
        return None
    if not all("!" <= c <= "~" and c not in _UNSAFE for c in value):
        return None
    return value


class RequestIds:
    """The public ids of the requests being served, each with its engine requests once made.

    An id is claimed before the request's prompts are tokenised (another request could otherwise
    take it meanwhile), bound to its engine requests once they exist, and released when its
    response ends. An id whose engine requests have all ended counts as free even if its release
    never came, and such ids are swept out as the table grows: the table holds the live requests."""

    def __init__(self) -> None:
        self._live: dict[str, tuple[Request, ...]] = {}  # () while claimed and not yet bound
        self._sweep_at = SWEEP_AT

    def claim(self, wanted: str | None, prefix: str, prompts: int,
              engine_has: Callable[[str], bool]) -> tuple[str, list[str]]:
        """A public id for a new request of `prompts` prompts and its engine requests' ids: `wanted`
        when it and those are free, else `wanted` with a random suffix; a fresh `prefix` id without
        one. `engine_has(id)`: whether the scheduler holds a live request of that id."""
        rid = wanted if wanted is not None else completion_id(prefix)
        while True:
            engine_ids = [rid] if prompts == 1 else [f"{rid}-{i}" for i in range(prompts)]
            if not self._taken(rid) and not any(engine_has(e) or self._taken(e) for e in engine_ids):
                break
            rid = f"{wanted}-{secrets.token_hex(4)}" if wanted is not None else completion_id(prefix)
        if len(self._live) >= self._sweep_at:
            self._sweep()
        self._live[rid] = ()
        return rid, engine_ids

    def bind(self, rid: str, requests: Sequence[Request]) -> None:
        self._live[rid] = tuple(requests)

    def release(self, rid: str) -> None:
        self._live.pop(rid, None)

    def requests(self, rid: str) -> tuple[Request, ...] | None:
        """The engine requests of public id `rid` while it is live; None if it is not a live one."""
        if not self._taken(rid):
            return None
        return self._live[rid]

    def __len__(self) -> int:
        return len(self._live)

    def _taken(self, rid: str) -> bool:
        requests = self._live.get(rid)
        if requests is None:
            return False
        if requests and all(r.is_terminal for r in requests):
            del self._live[rid]  # every engine request ended: the id is free again
            return False
        return True

    def _sweep(self) -> None:
        for rid in [rid for rid, requests in self._live.items() if requests and all(r.is_terminal for r in requests)]:
            del self._live[rid]
        self._sweep_at = max(SWEEP_AT, 2 * len(self._live))
