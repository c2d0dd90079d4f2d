"""Daemon settings: one dataclass, filled from defaults, then PEGAINFER_* environment variables, then
the TOML file (--config), then command-line flags (highest precedence). The flags, the TOML keys
and the environment names are all derived from the field names, so they cannot drift apart."""
from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
import typing
from pathlib import Path
from typing import Any

ENV_PREFIX = "PEGAINFER_"


class SettingsError(ValueError):
    pass


def _f(default: Any, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(slots=True)
class Settings:
    model: str | None = _f(None, "HF checkpoint folder (default: the embedded tiny model)")
    random_preset: str | None = _f(None, "serve random weights of a preset (tiny|lite) instead of --model")
    backend: str = _f("local", "EP backend: local, host-staged, nccl")
    ep_size: int = _f(1, "expert-parallel ranks")
    device: str = _f("cpu", "cpu or cuda[:N]")
    dtype: str | None = _f(None, "float32 or bfloat16 (default: float32 on CPU, bfloat16 on CUDA)")
    host: str = _f("127.0.0.1", "listen address")
    port: int = _f(8000, "listen port")
    served_model_name: str | None = _f(None, "model id in the API (default: the model folder's name)")
    max_active: int | None = _f(None, "requests decoding at once (KV slots); default: as many as fit in free GPU "
                                      "memory (at most 256) on CUDA, 8 on CPU")
    max_pending: int = _f(64, "requests waiting for a slot before 429")
    max_prefill_tokens: int = _f(8192, "prompt tokens per engine step; longer prompts are prefilled in chunks "
                                       "while running requests keep decoding")
    async_scheduling: bool = _f(True, "launch decode step N+1 before reading step N's tokens (vLLM's "
                                      "--async-scheduling, SGLang's overlap scheduler); --no-async-scheduling "
                                      "reads each step first")
    batch_invariant: bool = _f(True, "a request's output never depends on the batch around it (every reduction "
                                     "in a fixed order; vLLM's VLLM_BATCH_INVARIANT, SGLang's "
                                     "--enable-deterministic-inference, here the default); "
                                     "--no-batch-invariant lets kernels be chosen by row count")
    max_model_len: int | None = _f(None, "context limit in tokens (default: min(model limit, 4096))")
    max_tokens_default: int = _f(16, "max_tokens when a request gives none")
    drain_timeout: float = _f(30.0, "seconds in-flight requests get to finish on SIGTERM")
    api_key: str | None = _f(None, "bearer token required on /v1/* (optional)")
    max_body_bytes: int = _f(1 << 20, "largest accepted request body")
    http_header_timeout: float = _f(5.0, "seconds a connection gets to send a request's complete headers before "
                                         "it is closed (a slowloris guard)")
    http_body_timeout: float = _f(30.0, "seconds a request gets to send its whole body before it is refused "
                                        "with 408")
    max_connections: int | None = _f(None, "open HTTP connections; past it the longest idle one is closed, or a "
                                           "new one gets a 503 (default: 2 x (max_active + max_pending) + 64, "
                                           "within the descriptor limit)")
    tokenizer_workers: int = _f(2, "threads that tokenise long prompts off the event loop")
    sink_max_buffered: int = _f(4096, "unread tokens a stream may hold before it is cancelled")
    rank_timeout: float = _f(10.0, "seconds before a silent expert rank is declared failed")
    rank_join_timeout: float = _f(300.0, "seconds rank 0 waits for every expert rank to load and join")
    ep_master_addr: str | None = _f(None, "wait for expert ranks started with `pegainfer expert-worker` "
                                          "at this address (default: spawn them on this host)")
    ep_master_port: int = _f(29500, "rendezvous port for expert ranks on other hosts")
    ep_chunk_bytes: int | None = _f(None, "nccl backend: largest single collective in bytes (default 64 MiB)")
    trace_file: str | None = _f(None, "JSONL trace-record file (OTLP/JSON lines)")
    trace_file_max_mb: int = _f(64, "rotate the trace file (FILE -> FILE.1 -> ...) once it would pass this many MiB")
    trace_file_backups: int = _f(4, "rotated trace files kept beside the live one (0: none)")
    otlp_endpoint: str | None = _f(None, "OTLP/HTTP collector endpoint (also OTEL_EXPORTER_OTLP_ENDPOINT)")
    step_trace_every: int = _f(1, "record every Nth engine step as a span (0: none)")
    debug_traces: bool = _f(False, "serve recent spans at /debug/traces")
    debug_hooks: bool = _f(False, "enable /debug/stall and /debug/fail/{id} (fault-injection test hooks)")
    debug_load_delay: float = _f(0.0, "test hook: seconds to wait before loading (exercises the loading 503)")
    log_level: str = _f("info", "log level")
    # ---- logs (issue 31): JSON lines; docs/metrics.md ----
    access_log: bool = _f(False, "log one JSON line per HTTP request (method, path, status, duration, request id) "
                                 "on the pegainfer.access logger")
    log_stats_interval: float = _f(10.0, "seconds between stats log lines while serving (prompt and generation "
                                         "tokens/s, running, waiting, KV use; one a minute when idle); 0: none")

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


def _coerce(name: str, raw: Any, source: str) -> Any:
    hint = typing.get_type_hints(Settings)[name]
    base = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
    target = base[0] if typing.get_args(hint) else hint
    if raw is None:
        return None
    try:
        if target is bool:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("1", "true", "yes", "on"):
                return True
            if str(raw).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        return target(raw)
    except (TypeError, ValueError):
        raise SettingsError(f"{source}: {name} must be {target.__name__}, got {raw!r}") from None


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML settings file (keys as below, with underscores)")
    for f in dataclasses.fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=f.metadata["help"])
        else:
            p.add_argument(flag, default=None, help=f"{f.metadata['help']} (default: {f.default})")


def resolve(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
    environ = os.environ if environ is None else environ
    s = Settings()
    for name in Settings.field_names():
        key = ENV_PREFIX + name.upper()
        if key in environ:
            setattr(s, name, _coerce(name, environ[key], f"environment {key}"))
    if s.otlp_endpoint is None and environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        s.otlp_endpoint = environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
    config = getattr(args, "config", None) or environ.get(ENV_PREFIX + "CONFIG")
    if config:
        path = Path(config)
        try:
            table = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise SettingsError(f"{path}: settings file not found") from None
        except tomllib.TOMLDecodeError as e:
            raise SettingsError(f"{path}: invalid TOML: {e}") from None
        unknown = sorted(set(table) - set(Settings.field_names()))
        if unknown:
            raise SettingsError(f"{path}: unknown setting {unknown[0]!r}")
        for name, value in table.items():
            setattr(s, name, _coerce(name, value, str(path)))
    for name in Settings.field_names():
        value = getattr(args, name, None)
        if value is not None:
            setattr(s, name, _coerce(name, value, "--" + name.replace("_", "-")))
    _validate(s)
    return s


def _validate(s: Settings) -> None:
    if s.max_active is not None and s.max_active < 1:
        raise SettingsError(f"max_active must be at least 1, got {s.max_active}")
    for name in ("ep_size", "max_prefill_tokens", "max_tokens_default", "max_body_bytes", "sink_max_buffered",
                 "tokenizer_workers"):
        if getattr(s, name) < 1:
            raise SettingsError(f"{name} must be at least 1, got {getattr(s, name)}")
    if s.max_connections is not None and s.max_connections < 1:
        raise SettingsError(f"max_connections must be at least 1, got {s.max_connections}")
    for name in ("http_header_timeout", "http_body_timeout"):
        if not 0 < getattr(s, name) < float("inf"):
            raise SettingsError(f"{name} must be a positive, finite number of seconds, got {getattr(s, name)}")
    if s.trace_file_max_mb < 1:
        raise SettingsError(f"trace_file_max_mb must be at least 1, got {s.trace_file_max_mb}")
    if s.trace_file_backups < 0:
        raise SettingsError(f"trace_file_backups must be >= 0, got {s.trace_file_backups}")
    if s.max_pending < 0:
        raise SettingsError(f"max_pending must be >= 0, got {s.max_pending}")
    if not 0 < s.port < 65536:
        raise SettingsError(f"port must be 1..65535, got {s.port}")
    if s.dtype not in (None, "float32", "bfloat16"):
        raise SettingsError(f"dtype must be float32 or bfloat16, got {s.dtype!r}")
    _validate_logs(s)


def _validate_logs(s: Settings) -> None:
    if not 0 <= s.log_stats_interval < float("inf"):
        raise SettingsError(f"log_stats_interval must be 0 (off) or a positive, finite number of seconds, "
                            f"got {s.log_stats_interval}")
