"""Whether two bench_direct reports produced the same tokens: their token_hash per (sampling profile,
batch), for an A/B whose sides must choose the same tokens (for example `--sample-chunks 0` against
64, the device sampler's two launch shapes).

    python tools/dev/same_tokens.py A.json B.json

Prints one line per (profile, batch) of B; exit 0 when every one is also in A with the same hash, 1
otherwise, 2 when a report cannot be read."""
from __future__ import annotations

import json
import sys


def token_hashes(path: str) -> dict[tuple[str, int], str]:
    rows = json.load(open(path))["batches"]
    return {(r.get("sampling", "greedy"), r["batch"]): r["token_hash"] for r in rows}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: same_tokens.py A.json B.json", file=sys.stderr)
        return 2
    try:
        a, b = token_hashes(argv[0]), token_hashes(argv[1])
    except (OSError, KeyError, TypeError, ValueError) as e:
        print(f"cannot compare: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    same = True
    for key, h in b.items():
        ok = a.get(key) == h
        same &= ok
        print(f"{key[0]} batch {key[1]}: " + ("same tokens" if ok else f"DIFFERENT ({a.get(key)} vs {h})"))
    return 0 if same and b else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
