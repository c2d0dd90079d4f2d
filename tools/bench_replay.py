"""In-process serving replay: bench_serving's workload without HTTP, to measure the serving tax.

    python tools/bench_replay.py --profile short|mixed|long [--concurrency N[,N...]] [--num-requests N]
        [--repeats N] [--max-tokens N] [--prompt-words N] [--seed S] [--warmup N] [--warmup-concurrency N]
        [--detokenize]
        [--compare HTTP_REPORT.json] --out FILE.json [-- SERVE FLAGS...]

Everything after `--` is `pegainfer serve`'s own settings (--model, --random-preset, --device,
--max-active, --trace-file...), read by the daemon's own parser, so the runtime is built exactly as
the server builds it; --host/--port are ignored (nothing listens). The prompts, output lengths and
closed-loop concurrency are bench_serving's for the same flags (tools/benchkit/workload.py), and the
metrics keep vllm bench serve's definitions. With --compare (a bench_serving report of the same
workload, ideally from the same machine and call) the report adds the HTTP tax per level: HTTP
output tok/s over the replay's. With the server's --trace-file, each run also gets the engine's own
step summary (device busy share of the window). Writes FILE.json and FILE.md."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.benchkit import hardware, report, steps  # noqa: E402
from tools.benchkit.metrics import across_repeats, summarise, worst_marker  # noqa: E402
from tools.benchkit.replay import http_tax, replay_level, workload_mismatch  # noqa: E402
from tools.benchkit.workload import PROFILES, make_prompts, parse_levels, requests_per_level  # noqa: E402

HEADLINE = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms", "median_e2el_ms")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    own, serve = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", required=True, choices=sorted(PROFILES))
    p.add_argument("--concurrency", help="comma-separated levels (default 1,4,8,16,32,64,128,256)")
    p.add_argument("--num-requests", type=int, help="requests per level and repeat (default max(4 N, 16))")
    p.add_argument("--repeats", type=int, default=1, help="runs per level")
    p.add_argument("--max-tokens", type=int, help="output tokens per request (default: the profile's)")
    p.add_argument("--prompt-words", type=int, help="words per prompt for every request (default: the profile's)")
    p.add_argument("--seed", type=int, default=0, help="prompt text seed (bench_serving's)")
    p.add_argument("--warmup", type=int, default=2, help="requests run before measuring")
    p.add_argument("--warmup-concurrency", type=int, default=1,
                   help="closed-loop concurrency of the warm-up (default 1: one at a time, as bench_serving)")
    p.add_argument("--detokenize", action="store_true",
                   help="render each request's text as the HTTP path does (daemon.choices), so that only "
                        "HTTP, SSE and the client stay out")
    p.add_argument("--compare", type=Path, help="a bench_serving report of the same workload: adds the HTTP tax")
    p.add_argument("--out", type=Path, required=True, help="report JSON (FILE.md is written beside it)")
    a = p.parse_args(own)
    for name in ("num_requests", "max_tokens", "prompt_words"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.repeats < 1 or a.warmup < 0 or a.warmup_concurrency < 1:
        p.error("--repeats must be >= 1, --warmup >= 0 and --warmup-concurrency >= 1")
    try:
        a.levels = parse_levels(a.concurrency)
    except ValueError as e:
        p.error(str(e))
    if a.compare is not None and not a.compare.is_file():
        p.error(f"--compare {a.compare}: no such file")
    return a, serve


def serve_settings(flags: list[str]):
    """The daemon's settings from `pegainfer serve` flags, by the daemon's own parser."""
    from pegainfer.daemon.settings import add_flags, resolve
    p = argparse.ArgumentParser(prog="bench_replay.py ... --")
    add_flags(p)
    return resolve(p.parse_args(flags))


async def run(a: argparse.Namespace, settings) -> tuple[dict, dict, list[dict]]:
    from pegainfer.daemon.runtime import Runtime
    from pegainfer.daemon.telemetry_setup import telemetry_for
    rt = Runtime(settings, telemetry_for(settings))
    await rt.start(asyncio.get_running_loop())
    if rt.engine is None:
        raise SystemExit(f"bench_replay: error: the engine did not load: {rt.load_error}")
    try:
        profile = PROFILES[a.profile]
        max_tokens = a.max_tokens or profile.max_tokens
        warm = make_prompts(profile, a.warmup, a.seed + 1_000_003, a.prompt_words) if a.warmup else []
        warm_records = (await replay_level(rt, warm, a.warmup_concurrency, max_tokens,
                                           detokenize=a.detokenize))[0] if warm else []
        warmup = {"requests": len(warm), "failed": sum(not r.ok for r in warm_records)}
        levels = []
        for n in a.levels:
            count = requests_per_level(n, a.num_requests)
            prompts = make_prompts(profile, count, a.seed, a.prompt_words)
            runs = []
            for rep in range(a.repeats):
                window: list[int] = []  # first send to last completion, the duration's own interval
                records, duration = await replay_level(rt, prompts, n, max_tokens, detokenize=a.detokenize,
                                                       window=window)
                runs.append({"repeat": rep, "metrics": summarise(records, duration), "window_ns": window,
                             "errors": [f"request {r.index}: {r.error}" for r in records if r.error][:5]})
            summary = across_repeats([r["metrics"] for r in runs])
            levels.append({"concurrency": n, "requests": count, "runs": runs, "summary": summary,
                           "marker": worst_marker([summary[k]["marker"] for k in HEADLINE])})
        engine = {"model": rt.model_name, "backend": rt.engine.backend_name, "maturity": rt.engine.maturity,
                  "batch_invariant": rt.engine.batch_invariant, "device": settings.device,
                  "max_active": rt.engine.cache.num_slots, "max_model_len": rt.engine.max_model_len,
                  "async_scheduling": settings.async_scheduling}
        return engine, warmup, levels
    finally:
        rt.close()  # stops the GPU thread and the engine, and shuts telemetry down
        rt.tokenize.shutdown()


def markdown(rep: dict) -> str:
    lines = [f"# Serving replay (in process, no HTTP): {rep['workload']['summary']}", "",
             f"- command: `{rep['command']}`", f"- date: {rep['date']}, git {rep['git'].get('sha')}",
             f"- engine: {json.dumps(rep['engine'])}", "",
             "| concurrency | output tok/s | TTFT p50 ms | TPOT p50 ms | failed | marker |",
             "| ---: | ---: | ---: | ---: | ---: | --- |"]
    for lv in rep["levels"]:
        s = lv["summary"]
        lines.append(f"| {lv['concurrency']} | {report.fmt(s['output_throughput']['median'])} | "
                     f"{report.fmt(s['median_ttft_ms']['median'])} | {report.fmt(s['median_tpot_ms']['median'], 2)} | "
                     f"{sum(r['metrics']['failed'] for r in lv['runs'])} | {lv['marker']} |")
    if rep.get("http_tax"):
        lines += ["", f"HTTP tax against {rep['compare']}:", "",
                  "| concurrency | HTTP tok/s | replay tok/s | HTTP / replay | TPOT replay / HTTP |",
                  "| ---: | ---: | ---: | ---: | ---: |"]
        for t in rep["http_tax"]:
            lines.append(f"| {t['concurrency']} | {report.fmt(t['http_output_throughput'])} | "
                         f"{report.fmt(t['replay_output_throughput'])} | {report.fmt(t['throughput_ratio'], 3)} | "
                         f"{report.fmt(t['tpot_ratio'], 3)} |")
    return "\n".join(lines) + "\n"


def workload_of(a: argparse.Namespace) -> dict:
    """The replay's workload, in bench_serving's report fields (so that --compare can check them)."""
    profile = PROFILES[a.profile]
    words = f"{a.prompt_words}-word prompts" if a.prompt_words else profile.summary.split(",")[0]
    return {"profile": a.profile, "summary": f"{a.profile}: {words}", "prompt_words": a.prompt_words
            or list(profile.words), "max_tokens": a.max_tokens or profile.max_tokens, "seed": a.seed,
            "repeats": a.repeats, "num_requests": a.num_requests, "concurrency": a.levels, "ignore_eos": True,
            "detokenize": a.detokenize}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a, serve_flags = parse_args(argv)
    try:
        settings = serve_settings(serve_flags)
    except ValueError as e:  # SettingsError: one line, as `pegainfer serve` says it
        print(f"bench_replay: error: {e}", file=sys.stderr)
        return 2
    workload = workload_of(a)
    http_report = json.loads(a.compare.read_text()) if a.compare is not None else None
    if http_report is not None and (differ := workload_mismatch(workload, http_report)):
        print(f"bench_replay: error: --compare {a.compare} is another workload ({'; '.join(differ)})",
              file=sys.stderr)
        return 2
    engine, warmup, levels = asyncio.run(run(a, settings))
    if settings.trace_file:
        engine_steps = steps.read_steps(Path(settings.trace_file))
        for lv in levels:
            for r in lv["runs"]:
                r["server_steps"] = steps.summarise(engine_steps, *r["window_ns"]) if engine_steps else None
    rep = {
        "report_intent": "serving_replay",
        "tool": "tools/bench_replay.py",
        "command": hardware.command_line("tools/bench_replay.py", argv),
        "date": hardware.now_utc(),
        "git": hardware.git(),
        "host": {**hardware.host(), "gpus": hardware.nvidia_smi_gpus()},
        "engine": engine,
        "workload": workload | {"warmup": warmup},
        "metric_definitions": "vllm bench serve (tools/benchkit/metrics.py); a sink read with tokens is a chunk",
        "levels": levels,
    }
    if http_report is not None:
        rep["compare"] = str(a.compare)
        rep["http_tax"] = http_tax(levels, http_report)
    out, md = report.write(rep, a.out, markdown(rep))
    for lv in levels:
        print(report.level_line(lv), file=sys.stderr)
    for t in rep.get("http_tax", []):
        print(f"concurrency {t['concurrency']:>4}: HTTP / replay output tok/s = {report.fmt(t['throughput_ratio'], 3)}",
              file=sys.stderr)
    print(f"wrote {out} and {md}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
