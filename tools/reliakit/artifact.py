"""The artifact file: a run record with its provenance (tool, command line, date, pegainfer version
and git revision, what was asked for), validated against schema.py before it is written."""
from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

from tools.benchkit import hardware
from tools.reliakit.run_record import RunRecord
from tools.reliakit.schema import SCHEMA, SCHEMA_VERSION
from tools.reliakit.schema_check import validate

TOOL = "tools/reliability.py"
DRY_DATE = "2000-01-01T00:00:00+00:00"


class InvalidArtifact(RuntimeError):
    pass


def version() -> str | None:
    try:
        return metadata.version("pegainfer")
    except metadata.PackageNotFoundError:
        return None


def build(record: RunRecord, *, argv: list[str], requested: dict[str, Any], mode: str, dry_run: bool) -> dict:
    git = {"sha": None, "dirty": None} if dry_run else hardware.git()
    return {
        "artifact": "pegainfer-reliability",
        "schema_version": SCHEMA_VERSION,
        "tool": TOOL,
        "command": hardware.command_line(TOOL, argv),
        "date": DRY_DATE if dry_run else hardware.now_utc(),
        "dry_run": dry_run,
        "mode": mode,
        "pegainfer": {"version": version(), "git_sha": git["sha"], "git_dirty": git["dirty"]},
        "requested": requested,
        **record.to_dict(),
    }


def write(artifact: dict, out: Path) -> Path:
    problems = validate(artifact, SCHEMA)
    if problems:
        raise InvalidArtifact("the artifact does not match its schema: " + "; ".join(problems[:10]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(artifact, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
    return out
