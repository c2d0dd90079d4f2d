"""Issue 33's targets, read from the reports tools/dev/h200_sampling.sh writes: each sampling profile
against greedy, from bench_serving (one report per profile, levels c=1, c=64, and c=256 where run)
and from bench_direct (one report, every profile at every batch).

    python tools/dev/sampling_targets.py --serving DIR --direct FILE.json
    python tools/dev/sampling_targets.py --merge OUT.json IN.json...   (one profile's levels, run apart)

Targets (issue 33): at c=1 the TPOT p50 of top-p and of penalties at most 3 % above greedy's, of
logprobs at most 5 %; at c=64 and c=256 the mix's output tok/s at least 95 % of greedy's. Prints one
table per source and a line per target (met / MISSED / not run); exit 0 either way (a report)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROFILES = ("greedy", "top-p", "penalties", "logprobs", "mix")
TPOT_LIMITS = {"top-p": 1.03, "penalties": 1.03, "logprobs": 1.05}  # c=1 TPOT over greedy's, at most
MIX_FLOOR = 0.95  # mix output tok/s over greedy's at c=64 and c=256, at least


def serving_levels(folder: Path) -> dict[str, dict[int, tuple[float, float]]]:
    """profile -> concurrency -> (TPOT p50 ms, output tok/s), medians over repeats."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for p in PROFILES:
        f = folder / f"serving-{p}.json"
        if f.is_file():
            levels = json.loads(f.read_text())["levels"]
            out[p] = {lv["concurrency"]: (lv["summary"]["median_tpot_ms"]["median"],
                                          lv["summary"]["output_throughput"]["median"]) for lv in levels}
    return out


def targets(levels: dict[str, dict[int, tuple[float, float]]]) -> list[str]:
    lines = []
    base = levels.get("greedy", {})
    for p, limit in TPOT_LIMITS.items():
        got, ref = levels.get(p, {}).get(1), base.get(1)
        if got is None or ref is None or not ref[0] or got[0] is None:
            lines.append(f"c=1 {p} TPOT <= {limit:.2f}x greedy: not run")
            continue
        ratio = got[0] / ref[0]
        lines.append(f"c=1 {p} TPOT {got[0]:.3f} ms = {ratio:.3f}x greedy {ref[0]:.3f} ms (<= {limit:.2f}): "
                     + ("met" if ratio <= limit else "MISSED"))
    for c in (64, 256):
        got, ref = levels.get("mix", {}).get(c), base.get(c)
        if got is None or ref is None or not ref[1] or got[1] is None:
            lines.append(f"c={c} mix tok/s >= {MIX_FLOOR:.2f}x greedy: not run")
            continue
        ratio = got[1] / ref[1]
        lines.append(f"c={c} mix {got[1]:.0f} tok/s = {ratio:.3f}x greedy {ref[1]:.0f} (>= {MIX_FLOOR:.2f}): "
                     + ("met" if ratio >= MIX_FLOOR else "MISSED"))
    return lines


def serving_table(levels: dict[str, dict[int, tuple[float, float]]]) -> list[str]:
    rows = ["| profile | c | TPOT p50 ms | vs greedy | output tok/s | vs greedy |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    base = levels.get("greedy", {})
    for p, by_c in levels.items():
        for c, (tpot, tput) in sorted(by_c.items()):
            ref = base.get(c, (None, None))
            rows.append(f"| {p} | {c} | {_f(tpot, 3)} | {_ratio(tpot, ref[0])} | {_f(tput, 0)} | {_ratio(tput, ref[1])} |")
    return rows


def direct_table(path: Path) -> list[str]:
    batches = json.loads(path.read_text())["batches"]
    greedy = {b["batch"]: b for b in batches if b.get("sampling", "greedy") == "greedy"}
    rows = ["| profile | batch | TPOT p50 ms | vs greedy | decode tok/s |", "| --- | ---: | ---: | ---: | ---: |"]
    for b in batches:
        ref = greedy.get(b["batch"], {}).get("tpot_ms_p50")
        rows.append(f"| {b.get('sampling', 'greedy')} | {b['batch']} | {_f(b['tpot_ms_p50'], 3)} | "
                    f"{_ratio(b['tpot_ms_p50'], ref)} | {_f(b['decode_tok_s'], 0)} |")
    return rows


def _f(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ratio(x: float | None, ref: float | None) -> str:
    return "-" if x is None or not ref else f"{x / ref:.3f}x"


def merge(out: Path, parts: list[Path]) -> None:
    """One serving report of the levels of several (each run apart, with its own request count):
    the first's header, every level, and every command."""
    runs = [json.loads(f.read_text()) for f in parts if f.is_file()]
    if runs:
        merged = runs[0] | {"levels": [lv for r in runs for lv in r["levels"]], "commands": [r["command"] for r in runs]}
        out.write_text(json.dumps(merged, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--serving", type=Path, help="folder of serving-<profile>.json")
    p.add_argument("--direct", type=Path, help="bench_direct report with every profile")
    p.add_argument("--merge", type=Path, nargs="+", metavar=("OUT", "IN"), help="merge serving reports into OUT")
    a = p.parse_args(argv)
    if a.merge:
        merge(a.merge[0], a.merge[1:])
        return 0
    if a.direct is not None and a.direct.is_file():
        print("bench_direct (" + str(a.direct) + "):", *direct_table(a.direct), sep="\n")
    if a.serving is not None:
        levels = serving_levels(a.serving)
        print("bench_serving (" + str(a.serving) + "):", *serving_table(levels), "", "targets:", *targets(levels),
              sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
