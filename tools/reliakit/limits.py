"""What the server under test is: its model, EP backend and maturity (from /v1/models), and the
limits its scenarios size their traffic by (max_active and max_pending from /ready,
max_model_len and max_body_bytes from /v1/models)."""
from __future__ import annotations

import dataclasses

import httpx


class ServerUnusable(RuntimeError):
    """The server does not answer /v1/models or /ready the way pegainfer does."""


@dataclasses.dataclass(slots=True)
class Limits:
    model: str | None
    backend: str | None
    maturity: str | None
    ep_size: int
    max_active: int
    max_pending: int
    max_model_len: int
    max_body_bytes: int | None = None  # None: the server does not say
    batch_invariant: bool | None = None  # None: the server does not say

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


async def read_limits(http: httpx.AsyncClient) -> Limits:
    try:
        models = (await http.get("/v1/models", timeout=10)).json()["data"][0]
        ready = (await http.get("/ready", timeout=10)).json()
        sched = ready["scheduler"]
        return Limits(model=models.get("id"), backend=models.get("backend"), maturity=models.get("maturity"),
                      ep_size=int(ready.get("ep_size") or 1), max_active=int(sched["max_active"]),
                      max_pending=int(sched["max_pending"]), max_model_len=int(models["max_model_len"]),
                      max_body_bytes=int(models["max_body_bytes"]) if models.get("max_body_bytes") else None,
                      batch_invariant=models.get("batch_invariant"))
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        raise ServerUnusable(f"cannot read the server's model and limits: {type(e).__name__}: {e}") from None
