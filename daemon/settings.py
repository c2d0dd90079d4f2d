"""Daemon settings: one dataclass, filled from defaults, then PEGAINFER_* environment variables, then
the TOML file (--config), then command-line flags (highest precedence). The flags, the TOML keys
and the environment names are all derived from the field names, so they cannot drift apart; every
source is checked by the same code once they are merged, and a bad value is named by where it came
from (a flag, an environment variable, or the file and key). What needs the host (the model folder,
a CUDA device, the EP runtime) is checked by daemon.startup_check."""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import tomllib
import typing
from pathlib import Path
from typing import Any

from pegainfer.engine.default_model import preset_names
from pegainfer.ep.registry import REGISTRY, user_backends

ENV_PREFIX = "PEGAINFER_"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
DTYPES = ("float32", "bfloat16")
DEVICE = re.compile(r"cpu|cuda(:\d+)?")


class SettingsError(ValueError):
    pass


def _f(default: Any, help: str, choices: tuple[str, ...] | None = None, metavar: str | None = None) -> Any:
    """A setting: its default, its help line, and how --help shows its value (the choices, if any;
    _check_names refuses any other)."""
    if choices and metavar is None:
        metavar = "{" + ",".join(choices) + "}"
    return dataclasses.field(default=default, metadata={"help": help, "metavar": metavar})


@dataclasses.dataclass(slots=True)
class Settings:
    model: str | None = _f(None, "HF checkpoint folder (default: the embedded tiny model)", metavar="DIR")
    random_preset: str | None = _f(None, "serve random weights of a preset (tiny|lite) instead of --model",
                                   tuple(preset_names()))
    backend: str = _f("local", "EP backend: local, host-staged, nccl", tuple(user_backends()))
    ep_size: int = _f(1, "expert-parallel ranks")
    device: str = _f("cpu", "cpu or cuda[:N]", metavar="{cpu,cuda,cuda:N}")
    dtype: str | None = _f(None, "float32 or bfloat16 (default: float32 on CPU, bfloat16 on CUDA)", DTYPES)
    host: str = _f("127.0.0.1", "listen address")
    port: int = _f(8000, "listen port")
    served_model_name: str | None = _f(None, "model id in the API (default: the model folder's name)")
    max_active: int | None = _f(None, "sequences decoding at once (a cap; the KV pages admit them); default: 1024 "
                                      "on CUDA (the largest decode graph), 8 on CPU")
    kv_cache_tokens: int | None = _f(None, "KV cache size in tokens (pages of 64); default: what fits in free GPU "
                                           "memory after the weights on CUDA, a whole context for each of max(8, max_active) sequences on CPU")
    prefix_caching: bool = _f(True, "share the cached full pages of a prompt's prefix between requests (vLLM's "
                                    "automatic prefix caching); --no-prefix-caching computes every prompt")
    max_pending: int = _f(64, "requests waiting for a slot before 429")
    max_prefill_tokens: int = _f(8192, "prompt tokens per engine step; longer prompts are prefilled in chunks "
                                       "while running requests keep decoding")
    mixed_step_tokens: int = _f(8192, "tokens per engine step while requests decode: the decode rows plus the "
                                      "prompt chunks beside them (vLLM's max_num_batched_tokens), so that a long "
                                      "prompt adds a bounded time to the streams' steps; a prompt gets at least 64 "
                                      "tokens a step, and --max-prefill-tokens while nobody decodes")
    max_step_prompts: int = _f(64, "prompts (and prompt chunks) an engine step takes at most, the rest waiting "
                                   "for the next step in arrival order; 0: no bound. The default is what the "
                                   "CUDA prefill graphs hold: a step with more prompts runs them eagerly (one "
                                   "such step took 845 ms at c=256 on the H100, 2026-12-06)")
    async_scheduling: bool = _f(True, "launch decode step N+1 before reading step N's tokens (vLLM's "
                                      "--async-scheduling, SGLang's overlap scheduler); --no-async-scheduling "
                                      "reads each step first")
    async_admission: bool = _f(False, "with --async-scheduling, a plain greedy request admitted while a decode "
                                      "step is in flight joins the next launched step (its prompt in the prefill "
                                      "graph beside the decode rows) instead of waiting for that step to be read; "
                                      "off by default until measured on the GPU")
    batch_invariant: bool = _f(True, "a request's output never depends on the batch around it (every reduction "
                                     "in a fixed order; vLLM's VLLM_BATCH_INVARIANT, SGLang's "
                                     "--enable-deterministic-inference, here the default); "
                                     "--no-batch-invariant lets kernels be chosen by row count")
    compile_cache_dir: str | None = _f(None, "folder of compiled kernels kept across restarts (sets TRITON_CACHE_DIR "
                                             "and TORCHINDUCTOR_CACHE_DIR; created if missing), so that a restart "
                                             "skips compiling (default: Triton's own, ~/.triton/cache)",
                                       metavar="DIR")
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
    log_level: str = _f("info", "log level", LOG_LEVELS)
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


def _help(f: dataclasses.Field) -> str:
    """The flag's help: the setting's own line, and its default unless that line already says it."""
    text = f.metadata["help"]
    if "default" in text.lower() or f.default is None:
        return text
    shown = ("on" if f.default else "off") if isinstance(f.default, bool) else f.default
    return f"{text} (default: {shown})"


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE.toml", help="TOML settings file (keys as below, with underscores)")
    for f in dataclasses.fields(Settings):
        if f.type in ("bool", bool):
            p.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, default=None, help=_help(f))
        else:
            p.add_argument(flag(f.name), default=None, metavar=f.metadata["metavar"], help=_help(f))


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def device_arg(text: str) -> str:
    """argparse type of the --device flags that are not settings (generate, expert-worker, install-service)."""
    if not DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device (one of cpu, cuda, cuda:N)")
    return text


def resolve(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
    return resolve_sourced(args, environ)[0]


def resolve_sourced(args: argparse.Namespace, environ: dict[str, str] | None = None, *,
                    config_text: str | None = None) -> tuple[Settings, dict[str, str]]:
    """The settings, and for each one that was given, where: its flag, `environment NAME`, or
    `FILE: key`. config_text: the settings file's text, read in place of the file args.config names
    (install-service checks a file before it writes it)."""
    environ = os.environ if environ is None else environ
    s, where = Settings(), {}
    for name in Settings.field_names():
        key = ENV_PREFIX + name.upper()
        if key in environ:
            setattr(s, name, _coerce(name, environ[key], f"environment {key}"))
            where[name] = f"environment {key}"
    if s.otlp_endpoint is None and environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        s.otlp_endpoint = environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
    config = getattr(args, "config", None) or environ.get(ENV_PREFIX + "CONFIG")
    if config:
        path = Path(config)
        try:
            table = tomllib.loads(path.read_text() if config_text is None else config_text)
        except FileNotFoundError:
            raise SettingsError(f"{path}: settings file not found") from None
        except tomllib.TOMLDecodeError as e:
            raise SettingsError(f"{path}: invalid TOML: {e}") from None
        unknown = sorted(set(table) - set(Settings.field_names()))
        if unknown:
            raise SettingsError(f"{path}: unknown setting {unknown[0]!r}")
        for name, value in table.items():
            setattr(s, name, _coerce(name, value, str(path)))
            where[name] = f"{path}: {name}"
    for name in Settings.field_names():
        value = getattr(args, name, None)
        if value is not None:
            setattr(s, name, _coerce(name, value, flag(name)))
            where[name] = flag(name)
    _validate(s)
    _check_names(s, where)
    return s, where


def _validate(s: Settings) -> None:
    if s.max_active is not None and s.max_active < 1:
        raise SettingsError(f"max_active must be at least 1, got {s.max_active}")
    if s.kv_cache_tokens is not None and s.kv_cache_tokens < 64:
        raise SettingsError(f"kv_cache_tokens must be at least one page (64), got {s.kv_cache_tokens}")
    if s.max_step_prompts < 0:
        raise SettingsError(f"max_step_prompts must be 0 (no bound) or more, got {s.max_step_prompts}")
    for name in ("ep_size", "max_prefill_tokens", "mixed_step_tokens", "max_tokens_default", "max_body_bytes", "sink_max_buffered",
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


def _check_names(s: Settings, where: dict[str, str]) -> None:
    """The settings that name one of a fixed set of things, each refused with the source it came from."""
    def bad(name: str, what: str, known) -> SettingsError:
        return SettingsError(f"{where.get(name, flag(name))}: {getattr(s, name)!r} is not {what} "
                             f"(one of {', '.join(known)})")
    if s.log_level.lower() not in LOG_LEVELS:
        raise bad("log_level", "a log level", LOG_LEVELS)
    s.log_level = s.log_level.lower()
    if s.backend not in REGISTRY:
        raise bad("backend", "an EP backend", user_backends())
    if not DEVICE.fullmatch(s.device):
        raise bad("device", "a device", ("cpu", "cuda", "cuda:N"))
    if s.random_preset is not None and s.random_preset not in preset_names():
        raise bad("random_preset", "a preset", preset_names())
