"""Fixtures for the telemetry tests: one real daemon run per session (see run.py)."""
from __future__ import annotations

import pytest

from tests.telemetry.run import DaemonRun, run_daemon


@pytest.fixture(scope="session")
def daemon_run(tmp_path_factory: pytest.TempPathFactory) -> DaemonRun:
    return run_daemon(tmp_path_factory.mktemp("telemetry-daemon"))
