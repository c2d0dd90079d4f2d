"""The shared-prefix TTFT test of issue 27 against a running server: a PREFIX-token prompt (random ids
from a fixed seed) is sent once to warm the prefix cache, then `--repeats` requests of the same
prefix followed by a different short suffix each are streamed one at a time, each timed from the
request to its first content chunk (client side, so the HTTP round trip is included). Greedy and
ignore_eos, so that two servers (prefix caching on and off) can be compared token for token:
--compare FILE reads the other server's report and checks every suffix's text is the same.

    python tools/dev/prefix_ttft.py --base-url http://127.0.0.1:8000 --out on.json
    python tools/dev/prefix_ttft.py --base-url http://127.0.0.1:8000 --out off.json --compare on.json"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

import httpx


def prompt_ids(seed: int, n: int, low: int, high: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(low, high) for _ in range(n)]


def one(client: httpx.Client, url: str, model: str, ids: list[int], max_tokens: int) -> dict:
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, text, usage = None, [], None
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"prefix_ttft: HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                if ttft is None and c.get("text"):
                    ttft = time.perf_counter() - t0
                text.append(c.get("text", ""))
    return {"ttft_ms": None if ttft is None else round(ttft * 1e3, 2), "text": "".join(text),
            "cached_tokens": ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", default=None, help="default: the first of /v1/models")
    p.add_argument("--prefix", type=int, default=4000, help="shared prefix tokens")
    p.add_argument("--suffix", type=int, default=16, help="tokens after the prefix, different per request")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--seed", type=int, default=27)
    p.add_argument("--id-range", default="1000,30000", help="LOW,HIGH of the random token ids (the tiny model: 3,900)")
    p.add_argument("--out", required=True)
    p.add_argument("--compare", default=None, help="another server's report: every text must be the same")
    a = p.parse_args(argv)
    url = a.base_url.rstrip("/")
    low, high = (int(x) for x in a.id_range.split(","))
    with httpx.Client(timeout=120) as client:
        model = a.model or client.get(url + "/v1/models").json()["data"][0]["id"]
        prefix = prompt_ids(a.seed, a.prefix, low, high)
        warm = one(client, url, model, prefix + prompt_ids(a.seed + 1, a.suffix, low, high), a.max_tokens)
        runs = [one(client, url, model, prefix + prompt_ids(a.seed + 2 + i, a.suffix, low, high), a.max_tokens)
                for i in range(a.repeats)]
    ttfts = [r["ttft_ms"] for r in runs if r["ttft_ms"] is not None]
    rep = {"prefix_tokens": a.prefix, "suffix_tokens": a.suffix, "max_tokens": a.max_tokens, "first": warm,
           "runs": runs, "ttft_ms_min": min(ttfts), "ttft_ms_median": statistics.median(ttfts),
           "cached_tokens": sorted({r["cached_tokens"] for r in runs}, key=str)}
    code = 0
    if a.compare:
        other = json.load(open(a.compare))
        same = [x["text"] == y["text"] for x, y in zip([other["first"], *other["runs"]], [warm, *runs])]
        rep["same_text_as"] = {"file": a.compare, "all": all(same), "per_request": same}
        code = 0 if all(same) else 1
    with open(a.out, "w") as f:
        json.dump(rep, f, indent=1)
    print(json.dumps({k: rep[k] for k in ("ttft_ms_min", "ttft_ms_median", "cached_tokens")}
                     | ({"same_text": rep["same_text_as"]["all"]} if a.compare else {}) | {"first_ttft_ms": warm["ttft_ms"]}))
    return code


if __name__ == "__main__":
    sys.exit(main())
