"""The telemetry hub the daemon wires in: it observes every lifecycle transition and engine step
and fans them out to trace records and metrics. (Spans and metrics are filled in by the telemetry
issue; this is the seam the rest of the daemon calls.)"""
from __future__ import annotations


class Telemetry:
    def __init__(self) -> None:
        self.backend = "unknown"
        self.maturity = "unknown"
        self.model = "unknown"

    def set_engine(self, backend: str, maturity: str, model: str) -> None:
        self.backend, self.maturity, self.model = backend, maturity, model

    def on_transition(self, request, old, new) -> None:
        pass

    def on_step(self, record) -> None:
        pass

    def on_engine_died(self, message: str) -> None:
        pass

    def on_front_rejection(self, status: int, message: str, body: dict | None) -> None:
        """A request refused before it reached the scheduler (bad JSON, auth, validation)."""

    def on_request_attributes(self, request_id: str, parsed) -> None:
        """The parsed OpenAI request (model, max_tokens, temperature, stream) before submission."""

    def on_token_delta(self, request_id: str, n_tokens: int, now: float) -> None:
        pass

    def render_metrics(self, runtime) -> tuple[bytes, str]:
        return b"", "text/plain; version=0.0.4"

    def extra_routes(self, runtime) -> list:
        return []

    def shutdown(self) -> None:
        pass
