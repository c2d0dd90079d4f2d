"""The artifact's JSON Schema (draft 2020-12 keywords: type, properties, required,
additionalProperties, items, enum, minimum, $ref into $defs). docs/reliability.md describes every
field; tests/tools/test_reliability_artifact.py pins that a dry-run artifact validates."""
from __future__ import annotations

from tools.reliakit.observation import OUTCOMES, REASONS

SCHEMA_VERSION = 2  # 2: summary.checks, .skips, .allow_skips and the verdict `incomplete`

STR, INT, NUM, BOOL, OBJ, ARR, NULL = "string", "integer", "number", "boolean", "object", "array", "null"


def _obj(props: dict, required: list[str] | None = None, extra: bool = False) -> dict:
    return {"type": OBJ, "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": extra}


def _ref(name: str) -> dict:
    return {"$ref": f"#/$defs/{name}"}


def _n(t: str | list[str]) -> dict:
    """`t` or null."""
    return {"type": ([t] if isinstance(t, str) else list(t)) + [NULL]}


_COUNTS = {"type": OBJ, "additionalProperties": {"type": INT, "minimum": 0}}
_MAX = _obj({"trace": _n(INT), "ready": _n(INT)}, extra=True)

DEFS = {
    "check": _obj({"name": {"type": STR}, "status": {"enum": ["pass", "fail", "skip"]}, "detail": {"type": STR},
                   "data": {"type": OBJ}}),
    "expectation": _obj({"outcome": {"enum": list(OUTCOMES)}, "status": {"type": INT},
                         "server_reasons": {"type": ARR, "items": {"enum": list(REASONS)}},
                         "tokens": _n(INT), "error_code": _n(STR), "retry_after": {"type": BOOL},
                         "either": {"anyOf": [{"type": NULL}, _ref("expectation")]}}),
    "server_span": _obj({"terminal_reason": _n(STR), "response_id": _n(STR), "output_hash": _n(STR),
                         "output_tokens": _n(INT), "active_set_size_max": _n(INT),
                         "decode_batch_size_max": _n(INT), "pending_depth_at_admit": _n(INT),
                         "queue_s": _n(NUM), "http_status": _n(INT), "error": _n(STR), "backend": _n(STR),
                         "backend_maturity": _n(STR)}),
    "request": _obj({
        "label": {"type": STR}, "kind": _n(STR), "trace_id": {"type": STR}, "request_id": _n(STR),
        "body": {"type": STR}, "max_tokens": _n(INT), "status": _n(INT), "outcome": {"enum": list(OUTCOMES)},
        "tokens": _n(INT), "finish_reason": _n(STR), "text_sha256": _n(STR),
        "error": {"type": [OBJ, STR, NULL]}, "retry_after": _n(STR), "done": {"type": BOOL},
        "start_s": _n(NUM), "first_token_s": _n(NUM), "end_s": _n(NUM), "note": _n(STR),
        "expected": _ref("expectation"), "server": {"anyOf": [{"type": NULL}, _ref("server_span")]}}),
    "limits": _obj({"model": _n(STR), "backend": _n(STR), "maturity": _n(STR), "ep_size": {"type": INT},
                    "max_active": {"type": INT}, "max_pending": {"type": INT}, "max_model_len": {"type": INT},
                    "max_body_bytes": _n(INT), "batch_invariant": {"type": [BOOL, NULL]}}),
    "hash_group": _obj({"requests": {"type": INT, "minimum": 1}, "text_sha256": {"type": ARR, "items": {"type": STR}},
                        "output_hash": {"type": ARR, "items": {"type": STR}}}),
    "scenario": _obj({
        "name": {"type": STR}, "description": {"type": STR},
        "status": {"enum": ["passed", "failed", "skipped"]}, "skip_reason": _n(STR),
        "server": {"type": OBJ}, "limits": {"anyOf": [{"type": NULL}, _ref("limits")]}, "duration_s": _n(NUM),
        "outcomes": _COUNTS, "terminal_reasons": {"type": [OBJ, NULL], "additionalProperties": {"type": INT}},
        "hashes": {"type": OBJ, "additionalProperties": _ref("hash_group")},
        "trace_coverage": {"anyOf": [{"type": NULL}, _obj({"requests": {"type": INT}, "exactly_one": {"type": INT},
                                                           "missing": {"type": INT}, "duplicated": {"type": INT}})]},
        "maxima": {"anyOf": [{"type": NULL}, _obj({"active_set": _MAX, "pending_queue": _MAX,
                                                   "decode_batch": _MAX})]},
        "ready_probe": {"anyOf": [{"type": NULL}, _obj({
            "samples": {"type": INT}, "running_max": {"type": INT}, "waiting_max": {"type": INT},
            "decode_batch_max": _n(INT), "statuses": _COUNTS, "first_503_s": _n(NUM)})]},
        "facts": {"type": OBJ},
        "requests": {"type": ARR, "items": _ref("request")},
        "follow_up": {"anyOf": [{"type": NULL}, _ref("request")]},
        "checks": {"type": ARR, "items": _ref("check")}}),
    "daemon": _obj({"index": {"type": INT}, "flags": {"type": ARR, "items": {"type": STR}}, "url": {"type": STR},
                    "trace_file": {"type": STR}, "log": {"type": STR}, "startup_s": _n(NUM), "exit_code": _n(INT),
                    "ended_by": {"enum": ["runner_sigterm", "scenario", "forced_kill", "crashed", None]}}),
}

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "pegainfer reliability artifact",
    "$defs": DEFS,
    **_obj({
        "artifact": {"enum": ["pegainfer-reliability"]},
        "schema_version": {"enum": [SCHEMA_VERSION]},
        "tool": {"type": STR}, "command": {"type": STR}, "date": {"type": STR}, "dry_run": {"type": BOOL},
        "mode": {"enum": ["spawn", "url"]},
        "pegainfer": _obj({"version": _n(STR), "git_sha": _n(STR), "git_dirty": _n(BOOL)}),
        "requested": _obj({"url": _n(STR), "model": _n(STR), "random_preset": _n(STR), "device": _n(STR),
                           "backend": _n(STR), "ep_size": _n(INT),
                           "trace_file": _n(STR), "work_dir": _n(STR),
                           "scenarios": {"type": ARR, "items": {"type": STR}},
                           "burst": _obj({"size": {"type": INT}, "count": {"type": INT}})}),
        "target": {"anyOf": [{"type": NULL}, _ref("limits")]},
        "trace_files": {"type": ARR, "items": {"type": STR}},
        "daemons": {"type": ARR, "items": _ref("daemon")},
        "baseline": {"anyOf": [{"type": NULL}, _ref("request")]},
        "scenarios": {"type": ARR, "items": _ref("scenario")},
        "checks": {"type": ARR, "items": _ref("check")},
        "summary": _obj({"passed": {"type": ARR, "items": {"type": STR}},
                         "failed": {"type": ARR, "items": {"type": STR}},
                         "skipped": {"type": OBJ, "additionalProperties": _n(STR)},
                         "checks": _obj({k: {"type": INT, "minimum": 0}
                                         for k in ("total", "passed", "failed", "skipped")}),
                         "skips": {"type": ARR, "items": {"type": STR}}, "allow_skips": {"type": BOOL},
                         "verdict": {"enum": ["pass", "incomplete", "fail"]}, "exit_code": {"enum": [0, 1]}}),
    }),
}
