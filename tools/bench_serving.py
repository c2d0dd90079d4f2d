"""HTTP serving benchmark for any OpenAI-compatible streaming /v1/completions endpoint (pegainfer,
vLLM, SGLang), with vllm bench serve's metric definitions (tools/benchkit/metrics.py).

    python tools/bench_serving.py --base-url URL --profile short|mixed|long [--concurrency N[,N...]]
        [--num-requests N] [--repeats N] --out FILE.json [--trace-file PATH [--trace-wait S]] [--plot-dir DIR]
        [--claim TEXT] [--model NAME] [--max-tokens N] [--prompt-words N] [--seed S] [--timeout S]
        [--warmup N] [--api-key KEY] [--no-progress]
        [--sampling greedy|top-p|penalties|logprobs|mix]

--sampling picks the requests' sampling parameters by their index (tools/benchkit/sampling.py;
default greedy): a profile is the same mix at every concurrency level.

Closed loop: at each concurrency level N workers send requests back to back until the level's
requests are used up. Writes FILE.json (with every request's own latencies) and a markdown summary
FILE.md beside it. The bearer key comes from --api-key or PEGAINFER_API_KEY and is never written
into either: recorded command lines go through tools/benchkit/redact.py. A progress bar runs on
stderr when it is a terminal (--no-progress turns it off)."""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.benchkit import hardware, report, steps, traces  # noqa: E402
from tools.benchkit.client import ServerError, list_models, run_level  # noqa: E402
from tools.benchkit.metrics import across_repeats, summarise, worst_marker  # noqa: E402
from tools.benchkit.progress import Progress, wanted  # noqa: E402
from tools.benchkit.redact import redact_url  # noqa: E402
from tools.benchkit.sampling import PROFILES as SAMPLING, describe as describe_sampling  # noqa: E402
from tools.benchkit.workload import PROFILES, make_prompts, parse_levels, requests_per_level  # noqa: E402

ERRORS_KEPT = 5  # per run, in the report
KEY_ENV = "PEGAINFER_API_KEY"  # the daemon's own variable for its key
HEADLINE = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms", "median_e2el_ms")


def parse_args(argv: list[str]) -> argparse.Namespace:
    # no abbreviations: `--api K` must not slip past the redaction of `--api-key`'s value
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--profile", required=True, choices=sorted(PROFILES))
    p.add_argument("--concurrency", help="comma-separated levels (default 1,4,8,16,32,64,128,256)")
    p.add_argument("--num-requests", type=int, help="requests per level and repeat (default max(4 N, 16))")
    p.add_argument("--repeats", type=int, default=1, help="runs per level (median/min/max and a marker)")
    p.add_argument("--out", type=Path, required=True, help="report JSON (FILE.md is written beside it)")
    p.add_argument("--model", help="model name to send (default: the first of /v1/models)")
    p.add_argument("--max-tokens", type=int, help="output tokens per request (default: the profile's)")
    p.add_argument("--prompt-words", type=int, help="words per prompt for every request (default: the profile's)")
    p.add_argument("--seed", type=int, default=0, help="prompt text seed")
    p.add_argument("--sampling", choices=list(SAMPLING), default="greedy",
                   help="the requests' sampling parameters (tools/benchkit/sampling.py; default greedy)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a request may take in all")
    p.add_argument("--warmup", type=int, default=2, help="requests sent (one at a time) before measuring")
    p.add_argument("--api-key", help=f"bearer token for the server (default: ${KEY_ENV}); never recorded")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it only shows on a terminal)")
    p.add_argument("--trace-file", type=Path, help="the server's JSONL trace file, to join request records")
    p.add_argument("--trace-wait", type=float, default=120.0,
                   help="seconds to wait for the trace file to hold every request (a loaded server's exporter lags)")
    p.add_argument("--plot-dir", type=Path, help="write throughput/TTFT/TPOT PNGs here")
    p.add_argument("--claim", default="", help="claim boundary, e.g. 'HTTP pressure on one GPU'")
    p.add_argument("--client", choices=("httpx", "raw"), default="httpx",
                   help="the HTTP client: httpx (one pooled client, the default) or raw (plain HTTP/1.1, one "
                        "kept-alive connection per worker, http:// only: little client cost at high concurrency)")
    a = p.parse_args(argv)
    for name in ("num_requests", "max_tokens", "prompt_words"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.client == "raw" and not a.base_url.startswith("http://"):
        p.error("--client raw takes an http:// --base-url")
    if a.repeats < 1 or a.warmup < 0 or a.timeout <= 0:
        p.error("--repeats must be >= 1, --warmup >= 0 and --timeout > 0")
    try:
        a.levels = parse_levels(a.concurrency)
    except ValueError as e:
        p.error(str(e))
    a.key_from = "--api-key" if a.api_key else KEY_ENV if os.environ.get(KEY_ENV) else None
    a.api_key = a.api_key or os.environ.get(KEY_ENV) or None
    return a


def server_info(a: argparse.Namespace) -> dict:
    models = list_models(a.base_url, a.api_key)
    entry = next((m for m in models if m.get("id") == a.model), None) if a.model else models[0]
    if entry is None:
        raise ServerError(f"model {a.model!r} is not served (have: {', '.join(str(m.get('id')) for m in models)})")
    gpu = next((entry[k] for k in ("gpu", "gpu_name", "device_name") if entry.get(k)), None)
    return {"base_url": redact_url(a.base_url), "model": entry["id"], "backend": entry.get("backend"),
            "maturity": entry.get("maturity"), "batch_invariant": entry.get("batch_invariant"), "gpu": gpu,
            "models_entry": entry}


def run_sweep(a: argparse.Namespace, model: str, max_tokens: int) -> tuple[dict, list[dict]]:
    profile = PROFILES[a.profile]
    warm = make_prompts(profile, a.warmup, a.seed + 1_000_003, a.prompt_words) if a.warmup else []
    total = len(warm) + a.repeats * sum(requests_per_level(n, a.num_requests) for n in a.levels)
    with Progress(total, enabled=wanted(a.no_progress)) as bar:
        bar.stage("warmup")
        warm_records = asyncio.run(run_level(a.base_url, model, warm, 1, max_tokens, a.timeout, a.api_key,
                                             on_done=lambda r: bar.advance(), sampling=a.sampling,
                                             transport=a.client))[0] if warm else []
        warmup = {"requests": len(warm), "failed": sum(not r.ok for r in warm_records),
                  "errors": [r.error for r in warm_records if r.error][:ERRORS_KEPT]}
        levels = [_level(a, model, max_tokens, n, bar) for n in a.levels]
    return warmup, levels


def _level(a: argparse.Namespace, model: str, max_tokens: int, n: int, bar: Progress) -> dict:
    count = requests_per_level(n, a.num_requests)
    prompts = make_prompts(PROFILES[a.profile], count, a.seed, a.prompt_words)
    runs = []
    for rep in range(a.repeats):
        bar.stage(f"concurrency {n}" + (f" run {rep + 1}/{a.repeats}" if a.repeats > 1 else ""))
        window: list[int] = []  # first send to last completion, the duration's own interval
        records, duration = asyncio.run(run_level(a.base_url, model, prompts, n, max_tokens, a.timeout, a.api_key,
                                                  on_done=lambda r: bar.advance(), sampling=a.sampling, window=window,
                                                  transport=a.client))
        runs.append({"repeat": rep, "metrics": summarise(records, duration),
                     "window_ns": window,
                     "request_ids": [r.request_id for r in records],
                     "requests": [r.to_dict() for r in records],  # each request's own latencies
                     "errors": [f"request {r.index}: {r.error}" for r in records if r.error][:ERRORS_KEPT]})
    summary = across_repeats([r["metrics"] for r in runs])
    return {"concurrency": n, "requests": count, "runs": runs, "summary": summary,
            "marker": worst_marker([summary[k]["marker"] for k in HEADLINE])}


def join_traces(path: Path, levels: list[dict], wait_s: float) -> None:
    ids = {i for lv in levels for run in lv["runs"] for i in run["request_ids"] if i}
    spans = traces.read_until_covered(path, ids, wait_s)
    engine_steps = steps.read_steps(path)
    for lv in levels:
        lv["trace"] = traces.join_level([i for run in lv["runs"] for i in run["request_ids"]], spans)
        if engine_steps:  # pegainfer's step spans: where each run's time went on the server
            for run in lv["runs"]:
                run["server_steps"] = steps.summarise(engine_steps, *run["window_ns"])
        for run in lv["runs"]:  # client send -> server receipt (traces.arrival_lags)
            run["arrival_lag"] = traces.arrival_lags(run, spans)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(argv)
    try:
        server = server_info(a)
    except ServerError as e:
        print(f"bench_serving: error: {e}", file=sys.stderr)
        return 2
    profile = PROFILES[a.profile]
    max_tokens = a.max_tokens or profile.max_tokens
    warmup, levels = run_sweep(a, server["model"], max_tokens)
    if a.trace_file:
        join_traces(a.trace_file, levels, a.trace_wait)
    words = f"{a.prompt_words}-word prompts" if a.prompt_words else profile.summary.split(",")[0]
    rep = {
        "report_intent": "serving_benchmark",
        "tool": "tools/bench_serving.py",
        "command": hardware.command_line("tools/bench_serving.py", argv),
        "date": hardware.now_utc(),
        "git": hardware.git(),
        "claim": a.claim,
        "server": server,
        "auth": {"bearer": a.api_key is not None, "from": a.key_from},  # never the key itself
        "client_host": {**hardware.host(), "gpus": hardware.nvidia_smi_gpus()},
        "workload": {"profile": a.profile, "summary": f"{a.profile}: {words}; sampling {a.sampling}",
                     "sampling": describe_sampling(a.sampling), "prompt_words": a.prompt_words
                     or list(profile.words), "max_tokens": max_tokens, "seed": a.seed, "repeats": a.repeats,
                     "num_requests": a.num_requests, "concurrency": a.levels, "timeout_s": a.timeout,
                     "warmup": warmup, "ignore_eos": True, "stream": True, "client": a.client},
        "metric_definitions": "vllm bench serve (tools/benchkit/metrics.py); failed requests excluded from latencies",
        "trace_file": str(a.trace_file) if a.trace_file else None,
        "levels": levels,
        "plots": [],
    }
    if a.plot_dir:
        from tools.benchkit.plots import PlotsUnavailable, plot_levels
        try:
            rep["plots"] = [str(p) for p in plot_levels(levels, a.plot_dir, f" ({a.profile}, {server['model']})")]
        except PlotsUnavailable as e:
            rep["plots_skipped"] = str(e)
            print(f"bench_serving: warning: no plots: {e}", file=sys.stderr)
    out, md = report.write(rep, a.out, report.serving_markdown(rep))
    for lv in levels:
        print(report.level_line(lv), file=sys.stderr)
    print(f"wrote {out} and {md}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
