"""What the telemetry knows about the serving engine (backend, its maturity, the served model,
whether it is batch-invariant):
one small mutable record the hub fills in at set_engine and the span and metric writers read."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(slots=True)
class EngineInfo:
    backend: str = "unknown"
    maturity: str = "unknown"
    model: str = "unknown"
    batch_invariant: bool | None = None  # unknown until the engine is built

    def attributes(self) -> dict[str, str | bool]:
        out: dict[str, str | bool] = {"pegainfer.backend": self.backend, "pegainfer.backend_maturity": self.maturity}
        if self.batch_invariant is not None:
            out["pegainfer.batch_invariant"] = self.batch_invariant
        return out
