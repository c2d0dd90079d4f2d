"""A named check: pass, fail or skip, with a one-line detail a person can act on and the data it
was decided on. Every strict rule in the artifact is one of these."""
from __future__ import annotations

import dataclasses
from typing import Any

PASS, FAIL, SKIP = "pass", "fail", "skip"
LISTED = 8  # problems spelled out in a detail line before "... and N more"


@dataclasses.dataclass(slots=True)
class Check:
    name: str
    status: str
    detail: str
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "data": self.data}


def verdict(name: str, problems: list[str], ok_detail: str, data: dict[str, Any] | None = None) -> Check:
    """Pass with `ok_detail` when there are no problems, else fail listing them."""
    if not problems:
        return Check(name, PASS, ok_detail, data or {})
    shown = "; ".join(problems[:LISTED])
    more = f"; ... and {len(problems) - LISTED} more" if len(problems) > LISTED else ""
    return Check(name, FAIL, shown + more, {**(data or {}), "problems": problems})


def skipped(name: str, why: str) -> Check:
    return Check(name, SKIP, why)
