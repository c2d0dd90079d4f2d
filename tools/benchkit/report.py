"""Benchmark reports: the JSON file a run writes (the record of truth) and the markdown summary
beside it (FILE.md next to FILE.json), for the serving and the direct benchmark alike."""
from __future__ import annotations

import json
import math
from pathlib import Path

from tools.benchkit.steps import line as steps_line


def write(report: dict, out: Path, markdown: str) -> tuple[Path, Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
    md = out.with_suffix(".md")
    md.write_text(markdown)
    return out, md


def level_line(lv: dict) -> str:
    """One level of a serving report, as the tools print it when done."""
    s = lv["summary"]
    return (f"concurrency {lv['concurrency']:>4}: {fmt(s['output_throughput']['median'])} tok/s, "
            f"TTFT p50 {fmt(s['median_ttft_ms']['median'])} ms, TPOT p50 {fmt(s['median_tpot_ms']['median'])} ms, "
            f"failed {sum(r['metrics']['failed'] for r in lv['runs'])}, {lv['marker']}")


def fmt(x: float | int | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}f}"


def _header(r: dict, title: str) -> list[str]:
    g = r["git"]
    sha = (g["sha"] or "unknown")[:12] + (" (dirty tree)" if g.get("dirty") else "")
    return [f"# {title}", "", f"- Command: `{r['command']}`", f"- Date: {r['date']}", f"- Git: {sha}",
            f"- Report intent: `{r['report_intent']}`"]


# ---- serving ------------------------------------------------------------------------------------
def _pair(summary: dict, name: str) -> str:
    med, p99 = summary[f"median_{name}_ms"]["median"], summary[f"p99_{name}_ms"]["median"]
    return f"{fmt(med)} / {fmt(p99)}"


def serving_markdown(r: dict) -> str:
    s, c, w = r["server"], r["client_host"], r["workload"]
    lines = _header(r, f"Serving benchmark: `{w['profile']}` profile against {s['model']}")
    lines += [
        f"- Server: {s['base_url']}, model `{s['model']}`, backend `{s.get('backend') or 'unknown'}` "
        f"(maturity `{s.get('maturity') or 'unknown'}`), batch_invariant `{s.get('batch_invariant')}`",
        f"- Server GPU (as the server reports it): {s.get('gpu') or 'not reported'}",
        f"- Client host: {c['cpu']} ({c['cpu_count']} CPUs); GPUs on the client host: "
        f"{', '.join(c.get('gpus') or []) or 'none seen'}",
        f"- Claim boundary: {r['claim'] or 'none given'}",
        f"- Workload: {w['summary']}; max_tokens {w['max_tokens']} with ignore_eos; seed {w['seed']}; "
        f"{w['repeats']} repeat(s) per level; closed-loop concurrency; timeout {w['timeout_s']:g} s; "
        f"client {w.get('client', 'httpx')}",
        "",
        "Latencies in ms (median / p99 of the per-request values; with repeats, the median across "
        "repeats). TPOT = (E2EL - TTFT) / (output tokens - 1); ITL = gaps between content chunks. "
        "Failed requests are counted, never averaged. Marker: `failure` if any request of the level failed, "
        "else `noisy` if a headline metric's (max - min) / median across repeats exceeds 10 %, else `stable`"
        + (" (one repeat: only failures can show)." if w["repeats"] == 1 else "."),
        "",
        "| concurrency | requests | ok / failed / timed out | output tok/s | req/s | TTFT | TPOT | ITL | E2EL | "
        "prompt tok (mean) | marker |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for lv in r["levels"]:
        sm, runs = lv["summary"], lv["runs"]
        ok, failed, to = (sum(x["metrics"][k] for x in runs) for k in ("completed", "failed", "timed_out"))
        usage = all(x["metrics"]["usage_reported"] is not False for x in runs)
        prompt = sum(x["metrics"]["total_input_tokens"] for x in runs) / ok if ok and usage else None
        lines.append(
            f"| {lv['concurrency']} | {sum(x['metrics']['num_requests'] for x in runs)} | {ok} / {failed} / {to} | "
            f"{fmt(sm['output_throughput']['median'])} | {fmt(sm['request_throughput']['median'], 2)} | "
            f"{_pair(sm, 'ttft')} | {_pair(sm, 'tpot')} | {_pair(sm, 'itl')} | {_pair(sm, 'e2el')} | "
            f"{fmt(prompt)} | {lv['marker']} |")
    if any(run["metrics"]["usage_reported"] is False for lv in r["levels"] for run in lv["runs"]):
        lines += ["", "**The server sent no usage chunk for some requests: their output tokens were counted as "
                      "content chunks and their prompt tokens are unknown.**"]
    errors = [(lv["concurrency"], e) for lv in r["levels"] for run in lv["runs"] for e in run["errors"]]
    if errors:
        lines += ["", "First failures:", ""] + [f"- concurrency {n}: {e}" for n, e in errors[:10]]
    if any(lv.get("trace") for lv in r["levels"]):
        lines += ["", f"Server trace join ({r['trace_file']}):", "",
                  "| concurrency | coverage | missing | no id | active set max | decode batch max | "
                  "server queue s (median) |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for lv in r["levels"]:
            t = lv.get("trace") or {}
            cells = [fmt(t.get("coverage"), 3), *(fmt(t.get(k)) for k in ("missing", "without_id",
                     "active_set_size_max", "decode_batch_size_max")), fmt(t.get("server_queue_s_median"), 4)]
            lines.append(f"| {lv['concurrency']} | " + " | ".join(cells) + " |")
    stepped = [(lv["concurrency"], run) for lv in r["levels"] for run in lv["runs"] if run.get("server_steps")]
    if stepped:
        lines += ["", "Engine steps inside each run's window (server trace, `tools/benchkit/steps.py`):", ""]
        lines += [f"- concurrency {n}, run {run['repeat'] + 1}: {steps_line(run['server_steps'])}"
                  for n, run in stepped]
    lagged = [(lv["concurrency"], run) for lv in r["levels"] for run in lv["runs"] if run.get("arrival_lag")]
    if lagged:
        lines += ["", "Client send to server receipt (the request span's start; client, network and the server's "
                  "accept and read), ms:", ""]
        lines += [f"- concurrency {n}, run {run['repeat'] + 1}: median {fmt(run['arrival_lag']['median_ms'], 1)}, "
                  f"p99 {fmt(run['arrival_lag']['p99_ms'], 1)}, max {fmt(run['arrival_lag']['max_ms'], 1)} "
                  f"({run['arrival_lag']['requests']} requests)" for n, run in lagged]
    if r.get("plots"):
        lines += ["", "Plots: " + ", ".join(f"[{Path(p).name}]({p})" for p in r["plots"])]
    return "\n".join(lines) + "\n"


# ---- direct -------------------------------------------------------------------------------------
def _sampling(workload: dict) -> str:
    """The direct run's sampling: greedy, or its profiles (tools/benchkit/sampling.py)."""
    profiles = workload.get("sampling") or []
    if not profiles or [p["profile"] for p in profiles] == ["greedy"]:
        return "greedy"
    return "sampling " + "; ".join(f"{p['profile']} ({p['summary']})" for p in profiles)


def direct_markdown(r: dict) -> str:
    e, st = r["engine"], r["stack"]
    lines = _header(r, f"Direct benchmark: {e['model']} on {e['device']} ({e['dtype']})")
    lines += [
        f"- Backend: `{e['backend']}` (maturity `{e['maturity']}`), ep_size {e['ep_size']}, "
        f"batch_invariant `{e.get('batch_invariant')}`",
        f"- Hardware: GPU {st.get('gpu') or 'none'}; host {r['host']['cpu']} ({r['host']['cpu_count']} CPUs)",
        f"- Versions: torch {st['torch']} (CUDA {st.get('cuda') or '-'}), transformers {st.get('transformers') or '-'}",
        f"- Workload: prompt {r['workload']['prompt_len']} tokens "
        f"({r['workload'].get('prompts', 'the same in every row')}), "
        f"{r['workload']['new_tokens']} new tokens, {_sampling(r['workload'])}; warmup {r['workload']['warmup']}, "
        f"iters {r['workload']['iters']}",
        "- In-process, no HTTP: one prefill step with every row's prompt, then one step per decode token, "
        + ("overlapped as the daemon's --async-scheduling (each step launched before the one before it is read; "
           "timed from one step's tokens on the host to the next's)."
           if r["workload"].get("async_scheduling") else "each timed wall-clock with a device synchronize."),
        "",
        "| batch | prefill ms | TPOT p50 ms | TPOT mean ms | decode tok/s | HF TPOT p50 ms | HF / ours | "
        "tokens = HF | token hash |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    sampled = any(b.get("sampling", "greedy") != "greedy" for b in r["batches"])  # name each row's profile
    for b in r["batches"]:
        hf = b.get("hf") or {}
        same = "-" if not hf else ("yes" if hf.get("tokens_match") else "no")
        batch = f"{b['batch']} ({b['sampling']})" if sampled else b["batch"]
        lines.append(f"| {batch} | {fmt(b['prefill_ms_median'], 2)} | {fmt(b['tpot_ms_p50'], 2)} | "
                     f"{fmt(b['tpot_ms_mean'], 2)} | {fmt(b['decode_tok_s'])} | {fmt(hf.get('tpot_ms_p50'), 2)} | "
                     f"{fmt(b.get('hf_over_ours_tpot'), 2)} | {same} | `{b['token_hash'][:16]}` |")
    for b in r["batches"]:
        att = b.get("attribution")
        if not att:
            continue
        lines += ["", f"Attribution, batch {b['batch']} ({att['steps']} profiled decode steps, "
                      f"{fmt(att['wall_ms_per_step'], 2)} ms/step under the profiler):", "",
                  "| phase | calls/step | CPU ms/step | device ms/step |", "| --- | ---: | ---: | ---: |"]
        for name, p in att["phases"].items():
            lines.append(f"| {name} | {fmt(p['calls_per_step'])} | {fmt(p['cpu_ms_per_step'], 3)} | "
                         f"{fmt(p['device_ms_per_step'], 3)} |")
    if r.get("hf_setup"):
        lines += ["", f"HF side: {r['hf_setup']['how']}; attention `{r['hf_setup'].get('attn_implementation')}`, "
                      f"experts `{r['hf_setup'].get('experts_implementation')}`"]
    return "\n".join(lines) + "\n"
