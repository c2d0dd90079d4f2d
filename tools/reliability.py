"""The reliability gate: drives real streaming /v1/completions traffic through failure scenarios
(cancel and disconnect, invalid requests, overload past the active cap, mixed short/long traffic
with failures, drain, an expert rank killed mid-stream), joins every request with the server's
trace records, applies strict rules, and writes one JSON artifact (docs/reliability.md).

    python tools/reliability.py (--url URL [--trace-file PATH] | --spawn [--model DIR] [--backend B]
        [--ep-size N] [--device cpu|cuda] [--random-preset P] [--work-dir DIR]) --out ARTIFACT.json [--dry-run]
        [--scenarios a,b] [--allow-skips]

Exit status 0 only when every scenario that ran passed, every run-wide check passed and nothing was
skipped (a check that needs the trace file, a scenario that needs --spawn or ep >= 2), or skips were
accepted with --allow-skips; 1 otherwise (verdict FAIL or INCOMPLETE); 2 for a usage error. The
last line says the verdict and the counts, e.g. `PASS (45 checks, 12 skipped)`."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# imported after the sys.path line above, so that `python tools/reliability.py` finds the packages
from tools.benchkit.redact import redact_url
from tools.reliakit import artifact
from tools.reliakit.scenarios import SCENARIOS, connection_burst, select


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)  # --api K would dodge the redaction
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8000")
    where.add_argument("--spawn", action="store_true", help="start pegainfer daemons here, as each scenario needs")
    p.add_argument("--out", type=Path, required=True, help="the artifact (JSON)")
    p.add_argument("--dry-run", action="store_true", help="write a deterministic artifact without a server")
    p.add_argument("--scenarios", help=f"comma-separated subset of: {', '.join(SCENARIOS)} (default all)")
    p.add_argument("--trace-file", type=Path, help="with --url: the server's trace-record file (JSONL)")
    p.add_argument("--api-key", default=os.environ.get("PEGAINFER_API_KEY"),
                   help="with --url: the server's API key, sent as a bearer token (default: $PEGAINFER_API_KEY); "
                        "never recorded")
    p.add_argument("--allow-skips", action="store_true",
                   help="pass even when checks or scenarios were skipped (default: the verdict is INCOMPLETE, exit 1)")
    p.add_argument("--model", help="with --spawn: checkpoint folder (default: the embedded tiny model)")
    p.add_argument("--backend", default="local", help="with --spawn: EP backend (default local)")
    p.add_argument("--ep-size", type=int, default=1, help="with --spawn: expert-parallel ranks (default 1)")
    p.add_argument("--device", default="cpu", help="with --spawn: the daemons' device (cpu or cuda[:N]; default cpu)")
    p.add_argument("--random-preset", help="with --spawn: serve a preset's random weights (tiny|lite) instead of --model")
    p.add_argument("--work-dir", type=Path, help="with --spawn: where daemon logs and trace files go "
                                                 "(default: a new temporary folder)")
    p.add_argument("--burst", default="256x2",
                   help="connection_burst's shape: SIZExCOUNT new streaming connections at once, COUNT times "
                        "(default 256x2; the GPU gate uses 1024x10)")
    a = p.parse_args(argv)
    if not a.dry_run and not (a.url or a.spawn):
        p.error("give --url URL or --spawn (or --dry-run)")
    if a.url and (a.model or a.backend != "local" or a.ep_size != 1 or a.work_dir or a.device != "cpu"
                  or a.random_preset):
        p.error("--model, --random-preset, --backend, --ep-size, --device and --work-dir go with --spawn, not --url")
    if a.model and a.random_preset:
        p.error("give --model or --random-preset, not both")
    if a.trace_file and not a.url:
        p.error("--trace-file goes with --url (spawned daemons get their own)")
    if a.api_key and not a.url:
        a.api_key = None  # spawned daemons run without a key
    if a.ep_size < 1:
        p.error("--ep-size must be at least 1")
    try:
        a.selected = select(a.scenarios)
        connection_burst.SHAPE.update(connection_burst.parse_shape(a.burst))
    except ValueError as e:
        p.error(str(e))
    return a


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(argv)
    mode = "url" if a.url else "spawn"
    if a.dry_run:
        from tools.reliakit.dry_run import dry_record
        record = dry_record(a.selected, a.backend, a.ep_size, spawn=mode == "spawn")
    else:
        from tools.reliakit.client import use_key
        from tools.reliakit.runner import RunConfig, Runner
        use_key(a.api_key)
        if mode == "spawn":
            from pegainfer.ep.preflight import REFUSALS, preflight
            try:  # what the daemons would refuse (nccl without a GPU per rank), refused here in one line
                preflight(a.backend, a.device, a.ep_size)
            except REFUSALS as e:
                print(f"reliability: error: {e}", file=sys.stderr)
                return 2
        if mode == "spawn" and a.work_dir is None:
            a.work_dir = Path(tempfile.mkdtemp(prefix="pegainfer-reliability-"))
        if a.work_dir is not None:
            a.work_dir.mkdir(parents=True, exist_ok=True)
        cfg = RunConfig(a.selected, url=a.url, trace_file=a.trace_file, model=a.model, backend=a.backend,
                        ep_size=a.ep_size, work_dir=a.work_dir, device=a.device, random_preset=a.random_preset)
        record = Runner(cfg).run()
    record.allow_skips = a.allow_skips
    requested = {"url": redact_url(a.url), "model": a.model, "random_preset": a.random_preset,
                 "device": None if a.url else a.device, "backend": None if a.url else a.backend,
                 "ep_size": None if a.url else a.ep_size, "trace_file": str(a.trace_file) if a.trace_file else None,
                 "work_dir": str(a.work_dir) if a.work_dir else None, "scenarios": [s.name for s in a.selected],
                 "burst": dict(connection_burst.SHAPE)}
    doc = artifact.build(record, argv=argv, requested=requested, mode=mode, dry_run=a.dry_run)
    out = artifact.write(doc, a.out)
    s = doc["summary"]
    for run in doc["scenarios"]:
        failed = ", ".join(c["name"] for c in run["checks"] if c["status"] == "fail")
        skips = sum(c["status"] == "skip" for c in run["checks"])
        extra = f" ({run['skip_reason']})" if run["status"] == "skipped" else f" failed: {failed}" if failed else ""
        extra += f" ({skips} check{'s' if skips != 1 else ''} skipped)" if skips else ""
        print(f"{run['name']:<32} {run['status']}{extra}", file=sys.stderr)
    for c in doc["checks"]:
        print(f"run:{c['name']:<28} {c['status']}{'' if c['status'] != 'fail' else ': ' + c['detail'][:200]}",
              file=sys.stderr)
    if record.verdict == "incomplete":
        print(f"reliability: nothing failed, but {len(record.skips)} things were not checked "
              "(--allow-skips accepts that):", file=sys.stderr)
        for line in record.skips:
            print(f"  skipped {line[:200]}", file=sys.stderr)
    print(f"{record.verdict_line()}: wrote {out}", file=sys.stderr)
    return s["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
