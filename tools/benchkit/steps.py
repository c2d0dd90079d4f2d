"""Where a benchmark level's time went on the server: the engine-step spans of pegainfer's trace file
that fall inside the level's wall-clock window, summed by phase. It answers "was the GPU busy, and
with what": the device time of decode, prefill and mixed steps against the window, the decode batch,
the wall time between consecutive decode steps against their device time (the gap is host time the
device waited for), and how much of the window the trace holds (the exporter may lag behind a loaded
server, the span processor may drop spans under load, and --step-trace-every samples them).

    python -m tools.benchkit.steps TRACE.jsonl [--since-ns NS --until-ns NS] [--slowest N]

--slowest N also lists the window's N steps with the most device time that carry prompt rows
(mixed and prefill): how many rows, prompts and prompt tokens each held, device and GPU-thread time.
--gaps N lists where the device sat idle: the window's lead (its start to the first step's start),
its tail (the last step's device end to the window's end) and the N widest gaps between consecutive
steps (the next step's start less the earlier step's start and device time: steps run one after the
other on the device), each with the two steps around it. --first N lists the window's first N steps
(start from the window's start, phase, rows, prompts, device ms): how a burst of arrivals got going.

Timestamps are the server's wall clock: a window taken on the client compares only when client and
server share a host (or a synchronised clock)."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.traceview.reader import StepView, build, load  # noqa: E402

PHASES = ("decode", "mixed", "prefill")


def _num(step: StepView, key: str) -> float:
    v = step.attributes.get(f"pegainfer.step.{key}")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _window(steps: list[StepView], since_ns: int, until_ns: int) -> list[StepView]:
    """The steps that started inside [since_ns, until_ns], in start order."""
    return sorted((s for s in steps if since_ns <= s.start_ns <= until_ns), key=lambda s: (s.start_ns, s.index))


def summarise(steps: list[StepView], since_ns: int, until_ns: int) -> dict:
    """The steps that started inside [since_ns, until_ns], summed (see the module doc)."""
    window = _window(steps, since_ns, until_ns)
    window_s = (until_ns - since_ns) / 1e9
    count = {p: 0 for p in PHASES}
    device_s = {p: 0.0 for p in PHASES}
    for s in window:
        if s.phase in count:
            count[s.phase] += 1
            device_s[s.phase] += _num(s, "gpu_s")
    decode = [s for s in window if s.phase == "decode"]
    # wall time from one decode step's start to the next one's, where both are decode steps and
    # adjacent in the engine's numbering (a dropped or sampled-out span would merge two intervals)
    pairs = [(a, b) for a, b in zip(window, window[1:])
             if a.phase == b.phase == "decode" and b.index == a.index + 1]
    wall = [(b.start_ns - a.start_ns) / 1e6 for a, b in pairs]
    gpu = [_num(a, "gpu_s") * 1e3 for a, _ in pairs]
    indexes = [s.index for s in window]
    busy = sum(device_s.values())
    # the span exporter may lag behind a loaded server: the steps after the last exported one are
    # not in the file yet, so the sums are over the part of the window the trace covers
    covered_s = (min(until_ns, max(s.end_ns for s in window)) - since_ns) / 1e9 if window else 0.0
    return {
        "window_s": window_s,
        "covered_s": covered_s,
        "steps": len(window),
        "steps_in_trace": len(window) / (max(indexes) - min(indexes) + 1) if indexes else None,
        "count": count,
        "device_s": device_s,
        "device_busy": busy / covered_s if covered_s > 0 else None,
        "decode_rows_mean": statistics.fmean(_num(s, "decode_rows") for s in decode) if decode else None,
        "decode_wall_ms_median": statistics.median(wall) if wall else None,
        "decode_gpu_ms_median": statistics.median(gpu) if gpu else None,
        "prefill_tokens": int(sum(_num(s, "prefill_tokens") for s in window)),
        "overlapped": sum(1 for s in decode if s.attributes.get("pegainfer.step.overlapped") is True),
        "dropped_rows": int(sum(_num(s, "dropped_rows") for s in decode)),
    }


def slowest(steps: list[StepView], since_ns: int, until_ns: int, n: int) -> list[dict]:
    """The n steps with prompt rows (mixed, prefill) inside [since_ns, until_ns] with the most device
    time, slowest first: index, phase, rows, decode rows, prompt rows, prompt tokens, device and
    GPU-thread milliseconds."""
    window = [s for s in _window(steps, since_ns, until_ns) if s.phase in ("mixed", "prefill")]
    window.sort(key=lambda s: (-_num(s, "gpu_s"), s.index))
    out = []
    for s in window[:n]:
        rows, decode = int(_num(s, "rows")), int(_num(s, "decode_rows"))
        out.append({"index": s.index, "phase": s.phase, "rows": rows, "decode_rows": decode,
                    "prompt_rows": rows - decode, "prefill_tokens": int(_num(s, "prefill_tokens")),
                    "gpu_ms": round(_num(s, "gpu_s") * 1e3, 2), "cpu_ms": round(_num(s, "cpu_s") * 1e3, 2)})
    return out


def gaps(steps: list[StepView], since_ns: int, until_ns: int, n: int) -> dict:
    """The device's idle stretches in [since_ns, until_ns] (module doc): lead and tail in ms, and the n
    widest gaps between consecutive steps, widest first; `unknown` counts the stretches between steps
    whose indexes are not consecutive (a step missing from the file), left out of the idle sum."""
    window = _window(steps, since_ns, until_ns)
    if not window:
        return {"lead_ms": None, "tail_ms": None, "idle_ms": None, "widest": [], "unknown": 0}
    busy_end, end = [], float("-inf")  # one step after another on the device: a step launched while
    for s in window:  # its predecessor ran starts when that one ends
        end = max(float(s.start_ns), end) + _num(s, "gpu_s") * 1e9
        busy_end.append(end)
    between, unknown = [], 0
    for a, b, end in zip(window, window[1:], busy_end):
        if b.index != a.index + 1:  # a step between them is not in the file (dropped, sampled out): its
            unknown += 1  # device time is unknown, so the stretch is not counted as idle
            continue
        between.append({"after": a.index, "after_phase": a.phase, "before": b.index, "before_phase": b.phase,
                        "ms": max(0.0, (b.start_ns - end) / 1e6)})
    lead, tail = (window[0].start_ns - since_ns) / 1e6, max(0.0, (until_ns - busy_end[-1]) / 1e6)
    widest = sorted(between, key=lambda g: -g["ms"])[:n]
    return {"lead_ms": round(lead, 3), "tail_ms": round(tail, 3),
            "idle_ms": round(lead + tail + sum(g["ms"] for g in between), 3),
            "widest": [{**g, "ms": round(g["ms"], 3)} for g in widest], "unknown": unknown}


def first(steps: list[StepView], since_ns: int, until_ns: int, n: int) -> list[dict]:
    """The window's first n steps: start (ms from since_ns), index, phase, rows, prompt rows, prompt
    tokens and device ms."""
    return [{"at_ms": round((s.start_ns - since_ns) / 1e6, 3), "index": s.index, "phase": s.phase,
             "rows": int(_num(s, "rows")), "prompt_rows": int(_num(s, "rows") - _num(s, "decode_rows")),
             "prefill_tokens": int(_num(s, "prefill_tokens")), "gpu_ms": round(_num(s, "gpu_s") * 1e3, 3)}
            for s in _window(steps, since_ns, until_ns)[:n]]


def read_steps(path: Path) -> list[StepView]:
    return build(load(str(path)))[1]


def line(summary: dict) -> str:
    """One printable line of a summary."""
    def f(v, d=1):
        return "-" if v is None else f"{v:,.{d}f}"
    c, d = summary["count"], summary["device_s"]
    covered, window = summary.get("covered_s") or 0.0, summary["window_s"]
    partial = "PARTIAL (the trace file did not cover the window yet): " if covered < 0.95 * window else ""
    return (f"{partial}{f(summary['window_s'], 2)} s window (the trace covers {f(summary.get('covered_s'), 2)} s), "
            f"{summary['steps']} steps "
            f"({f(summary['steps_in_trace'] and 100 * summary['steps_in_trace'])} % of them in the trace): "
            f"device busy {f(summary['device_busy'] and 100 * summary['device_busy'])} %; "
            f"decode {c['decode']} steps / {f(d['decode'], 3)} s, mixed {c['mixed']} / {f(d['mixed'], 3)} s, "
            f"prefill {c['prefill']} / {f(d['prefill'], 3)} s; decode rows mean {f(summary['decode_rows_mean'])}, "
            f"decode step wall / device median {f(summary['decode_wall_ms_median'], 2)} / "
            f"{f(summary['decode_gpu_ms_median'], 2)} ms; prefill tokens {summary['prefill_tokens']:,}; "
            f"overlapped {summary['overlapped']}, dropped rows {summary['dropped_rows']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", type=Path, help="the server's JSONL trace file")
    p.add_argument("--since-ns", type=int, help="window start, Unix ns (default: the first step)")
    p.add_argument("--until-ns", type=int, help="window end, Unix ns (default: the last step)")
    p.add_argument("--slowest", type=int, default=0, metavar="N",
                   help="also list the N steps with prompt rows that took the most device time")
    p.add_argument("--gaps", type=int, default=0, metavar="N",
                   help="also list the window's lead, tail and the N widest idle gaps between steps")
    p.add_argument("--first", type=int, default=0, metavar="N", help="also list the window's first N steps")
    a = p.parse_args(argv)
    for flag in ("slowest", "gaps", "first"):
        if getattr(a, flag) < 0:
            print(f"steps: error: --{flag} takes 0 or more, got {getattr(a, flag)}", file=sys.stderr)
            return 2
    if not a.trace.is_file():
        print(f"steps: error: no trace file at {a.trace}", file=sys.stderr)
        return 2
    steps = read_steps(a.trace)
    if not steps:
        print(f"steps: error: {a.trace} holds no engine-step spans", file=sys.stderr)
        return 2
    since = a.since_ns if a.since_ns is not None else min(s.start_ns for s in steps)
    until = a.until_ns if a.until_ns is not None else max(s.start_ns for s in steps)
    print(line(summarise(steps, since, until)))
    for r in slowest(steps, since, until, a.slowest):
        print(f"  step {r['index']} {r['phase']}: {r['rows']} rows ({r['decode_rows']} decode, {r['prompt_rows']} "
              f"prompts, {r['prefill_tokens']:,} prompt tokens), device {r['gpu_ms']:,.2f} ms, "
              f"GPU thread {r['cpu_ms']:,.2f} ms")
    if a.gaps:
        g = gaps(steps, since, until, a.gaps)
        if g["lead_ms"] is None:
            print("  idle: no step started inside the window")
        else:
            skipped = (f" ({g['unknown']} stretches beside a step missing from the file not counted)"
                       if g["unknown"] else "")
            print(f"  idle: lead {g['lead_ms']:,.2f} ms, tail {g['tail_ms']:,.2f} ms, all {g['idle_ms']:,.2f} ms"
                  f"{skipped}; widest gaps:")
        for w in g["widest"]:
            print(f"    {w['ms']:,.3f} ms after step {w['after']} ({w['after_phase']}), "
                  f"before step {w['before']} ({w['before_phase']})")
    for r in first(steps, since, until, a.first):
        print(f"  +{r['at_ms']:,.1f} ms step {r['index']} {r['phase']}: {r['rows']} rows ({r['prompt_rows']} prompts, "
              f"{r['prefill_tokens']:,} prompt tokens), device {r['gpu_ms']:,.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
