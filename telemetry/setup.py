"""Builds the daemon's telemetry from its settings."""
from __future__ import annotations

from telemetry.hub import Telemetry


def build_telemetry(settings) -> Telemetry:
    return Telemetry()
