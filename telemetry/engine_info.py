"""What the telemetry knows about the serving engine (backend, its maturity, the served model):
one small mutable record the hub fills in at set_engine and the span and metric writers read."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(slots=True)
class EngineInfo:
    backend: str = "unknown"
    maturity: str = "unknown"
    model: str = "unknown"

    def attributes(self) -> dict[str, str]:
        return {"pegainfer.backend": self.backend, "pegainfer.backend_maturity": self.maturity}
