"""Greedy agreement with HF transformers at a working dtype (bf16 on the GPU), measured beside the
number that makes it readable: how far HF's own bf16 run is from the exact answer.

    python tools/agreement.py --preset lite --device cuda --out report.json      # random lite weights
    python tools/agreement.py --model DIR [--engine-model DIR] --device cpu --dtype float32 --out report.json
        [--cases tests/data/cases.json] [--max-tokens 64] [--reference-dtype float32] [--min-agreement 0.99]

Three runs over the committed case set, every row greedy for --max-tokens steps (EOS ignored):
  reference  HF in float32 on the same weights (a bf16 checkpoint widened, nothing re-rounded)
  hf         HF at --dtype (skipped when it is the reference's dtype: the reference stands in)
  ours       pegainfer at --dtype, served path (CUDA graphs and Triton kernels where they apply)
Free-running pairs report the share of tokens before each row's first divergence ("prefix", the
HF oracle's token_agreement) and the share equal step by step ("position"). Teacher-forced, each of
hf and ours is fed the reference's tokens and scored on how often its own pick equals the
reference's next token ("forced"): divergence cannot cascade there, so it reads as the per-step
accuracy of the bf16 arithmetic. The issue's target is ours_vs_hf prefix agreement >= 0.99;
"as_close_as_hf" reads issue 30's on a trained checkpoint: ours as close to the reference as HF at
--dtype, free-running and forced, and forced agreement >= 0.99.

Exit 0 with a report; 1 when --min-agreement is given and ours_vs_hf prefix agreement is below it;
2 with one line on stderr for bad input (unknown preset, missing folder, HF mis-loading a weight).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from pegainfer.engine.batch import RowInput  # noqa: E402
from pegainfer.engine.engine import EngineSpec, build_engine  # noqa: E402
from pegainfer.engine.generate import generate  # noqa: E402
from pegainfer.engine.contract import SamplingParams  # noqa: E402
from pegainfer.engine.presets import DTYPES, PRESETS  # noqa: E402
from pegainfer.engine.sampler import Draw  # noqa: E402
from pegainfer.engine.step_plan import StepPlan  # noqa: E402
from pegainfer.engine.tokenizer import Tokenizer  # noqa: E402
from tools.benchkit import hardware, hf_side  # noqa: E402
from tools.hf_oracle import DEFAULT_CASES, GateError, checkpoint_hash, hf_greedy, load_cases  # noqa: E402

TARGET = 0.99  # issue #9: bf16 greedy agreement with HF bf16 on the case set, 64 steps


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help=f"random weights of a preset's shapes ({', '.join(sorted(PRESETS))})")
    src.add_argument("--model", type=Path, help="HF checkpoint folder (HF, and pegainfer unless --engine-model)")
    p.add_argument("--engine-model", type=Path, help="checkpoint folder pegainfer loads instead (with --model)")
    p.add_argument("--seed", type=int, default=0, help="weights seed of --preset")
    p.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    p.add_argument("--max-tokens", type=int, default=64, help="greedy steps per row (every case)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="ours and hf")
    p.add_argument("--reference-dtype", default="float32", choices=["bfloat16", "float32"])
    p.add_argument("--min-agreement", type=float, help="exit 1 when ours_vs_hf prefix agreement is below it")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if a.max_tokens < 1:
        p.error("--max-tokens must be at least 1")
    if a.engine_model and not a.model:
        p.error("--engine-model goes with --model")
    return a


def compare(cand: list[list[int]], ref: list[list[int]]) -> dict:
    """Free-running agreement of two runs' rows (same prompts, same lengths)."""
    firsts = [next((i for i, (x, y) in enumerate(zip(c, r)) if x != y), None) for c, r in zip(cand, ref)]
    total = sum(len(r) for r in ref)
    prefix = sum(len(r) if f is None else f for f, r in zip(firsts, ref))
    same = sum(x == y for c, r in zip(cand, ref) for x, y in zip(c, r))
    return {"prefix_agreement": prefix / total, "position_agreement": same / total, "tokens": total,
            "rows_equal": sum(f is None for f in firsts), "rows": len(ref), "first_divergence_steps": firsts}


def forced_score(picks: list[list[int]], ref: list[list[int]]) -> dict:
    """Teacher-forced: how often a run's pick after the reference's prefix is the reference's token."""
    total = sum(len(r) for r in ref)
    hits = sum(x == y for p, r in zip(picks, ref) for x, y in zip(p, r))
    return {"forced_agreement": hits / total, "tokens": total, "misses": total - hits}


class HFRun:
    """HF transformers holding the weights at one dtype: greedy generate() per row, as the oracle."""

    def __init__(self, a: argparse.Namespace, dtype: torch.dtype, weights_dtype: torch.dtype, norm_topk: bool):
        self.device = a.device
        if a.model:
            self.model, self.how = hf_side.from_dir(str(a.model), dtype, a.device)
        else:
            self.model, self.how = hf_side.from_preset(a.preset, a.seed, dtype, a.device, weights_dtype)
        self.norm_topk = norm_topk

    def run(self, cases: list[dict], max_tokens: int, forced_on: list[list[int]] | None) -> tuple[list, list]:
        free, forced = [], []
        with hf_side.routing_patch(self.model, self.norm_topk), torch.inference_mode():
            rows = [p for c in cases for p in c["prompts"]]
            for i, prompt in enumerate(rows):
                free.append(hf_greedy(self.model, prompt, max_tokens, self.device))
                if forced_on is not None:
                    seq = torch.tensor([prompt + forced_on[i][:-1]], device=self.device)  # [1, P + T - 1]
                    logits = self.model(seq).logits[0, len(prompt) - 1:]  # [T, V]
                    forced.append(logits.argmax(-1).tolist())
        return free, forced

    def describe(self) -> dict:
        return {"how": self.how, **hf_side.describe(self.model)}

    def close(self) -> None:
        del self.model
        release_memory(self.device)


def release_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def ours_forced(engine, prompts: list[list[int]], refs: list[list[int]]) -> list[list[int]]:
    """Our greedy pick at every step when each row is fed the reference's tokens, not its own."""
    slots = [engine.cache.allocate() for _ in prompts]
    greedy = SamplingParams()
    try:
        picks: list[list[int]] = [[] for _ in prompts]
        rows = [RowInput(s, p, 0) for s, p in zip(slots, prompts)]
        for step in range(len(refs[0])):
            draws = [Draw(r, greedy, 0, 0, step, prompts[r], refs[r][:step]) for r in range(len(rows))]
            for r, tok in enumerate(engine.runner.run(StepPlan(rows, draws=draws)).tokens):
                picks[r].append(tok)
            rows = [RowInput(row.slot, [refs[r][step]], row.start_pos + len(row.token_ids))
                    for r, row in enumerate(rows)]
        return picks
    finally:
        for s in slots:
            engine.cache.release(s)


def run_ours(a: argparse.Namespace, cases: list[dict], refs: list[list[int]]) -> tuple[list, list, dict]:
    longest = max(len(p) for c in cases for p in c["prompts"])
    engine_dir = a.engine_model or a.model
    spec = EngineSpec(model_dir=str(engine_dir) if engine_dir else None, random_preset=a.preset, seed=a.seed,
                      device=a.device, dtype=a.dtype, max_model_len=longest + a.max_tokens + 1,
                      num_slots=max(len(c["prompts"]) for c in cases))
    engine = build_engine(spec)
    try:
        free, forced, start = [], [], 0
        for c in cases:
            n = len(c["prompts"])
            free += [g.token_ids for g in generate(engine, c["prompts"], a.max_tokens, ignore_eos=True)]
            forced += ours_forced(engine, c["prompts"], refs[start:start + n])
            start += n
        info = {"backend": engine.backend_name, "maturity": engine.maturity,
                "batch_invariant": engine.batch_invariant,
                "cuda_graphs": engine.runner.graphs is not None,
                "triton_kernels": engine.model.kernels.triton}
        return free, forced, info
    finally:
        engine.close()
        release_memory(a.device)


def measure(a: argparse.Namespace) -> dict:
    if a.preset and a.preset not in PRESETS:
        raise GateError(f"unknown preset {a.preset!r} (known: {', '.join(sorted(PRESETS))})")
    for d in (a.model, a.engine_model):
        if d is not None and not (d / "config.json").is_file():
            raise GateError(f"{d} is not a checkpoint folder (no config.json)")
    if a.model:
        tok = Tokenizer(str(a.model))
        norm_topk = bool(json.loads((a.model / "config.json").read_text()).get("norm_topk_prob"))
    else:
        from pegainfer.engine.default_model import ensure_preset_tokenizer
        tok = Tokenizer(str(ensure_preset_tokenizer(a.preset)))
        norm_topk = bool(PRESETS[a.preset].get("norm_topk_prob"))
    cases = load_cases(a.cases, tok)
    dtype, ref_dtype = DTYPES[a.dtype], DTYPES[a.reference_dtype]
    reference = HFRun(a, ref_dtype, dtype, norm_topk)
    ref_free, _ = reference.run(cases, a.max_tokens, None)
    hf_info = {"reference": reference.describe()}
    if dtype == ref_dtype:  # HF at the working dtype is the reference itself
        hf_free, hf_forced = ref_free, None
        reference.close()
    else:
        reference.close()
        hf = HFRun(a, dtype, dtype, norm_topk)
        hf_free, hf_forced = hf.run(cases, a.max_tokens, ref_free)
        hf_info["hf"] = hf.describe()
        hf.close()
    ours_free, ours_forced_picks, engine_info = run_ours(a, cases, ref_free)
    pairs = {"ours_vs_hf": compare(ours_free, hf_free), "hf_vs_reference": compare(hf_free, ref_free),
             "ours_vs_reference": compare(ours_free, ref_free)}
    forced = {"hf": forced_score(hf_forced, ref_free) if hf_forced is not None else None,
              "ours": forced_score(ours_forced_picks, ref_free)}
    got = pairs["ours_vs_hf"]["prefix_agreement"]
    return {
        "report_intent": "correctness",
        "tool": "tools/agreement.py",
        "date": hardware.now_utc(),
        "git": hardware.git(),
        "host": hardware.host(),
        "stack": hardware.torch_stack(a.device),
        "weights": f"random preset {a.preset} (seed {a.seed})" if a.preset else
        {"model": str(a.model), "checkpoint_hash": checkpoint_hash(a.model),
         "engine_model": str(a.engine_model) if a.engine_model else None},
        "device": a.device, "dtype": a.dtype, "reference_dtype": a.reference_dtype,
        "cases": str(a.cases), "case_count": len(cases), "row_count": len(ref_free), "max_tokens": a.max_tokens,
        "engine": engine_info, "hf": hf_info,
        "target": {"measure": "ours_vs_hf prefix_agreement", "threshold": TARGET, "value": got, "met": got >= TARGET},
        "pairs": pairs, "forced": forced, "as_close_as_hf": as_close_as_hf(pairs, forced),
        "tokens": {"reference": ref_free, "hf": hf_free, "ours": ours_free},
    }


def as_close_as_hf(pairs: dict, forced: dict) -> dict | None:
    """Issue 30's reading (a trained checkpoint): ours at --dtype at least as close to the float32
    reference as HF at --dtype, free-running (prefix share) and teacher-forced, and teacher-forced
    agreement of at least 0.99. None where HF's run was the reference (no second dtype)."""
    if forced["hf"] is None:
        return None
    prefix = (pairs["ours_vs_reference"]["prefix_agreement"], pairs["hf_vs_reference"]["prefix_agreement"])
    taught = (forced["ours"]["forced_agreement"], forced["hf"]["forced_agreement"])
    checks = {"prefix": prefix[0] >= prefix[1], "forced": taught[0] >= taught[1], "forced_at_least_0.99": taught[0] >= 0.99}
    return {"ours_vs_reference_prefix": prefix[0], "hf_vs_reference_prefix": prefix[1], "ours_forced": taught[0],
            "hf_forced": taught[1], **checks, "met": all(checks.values())}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(argv)
    try:
        report = measure(a)
    except (GateError, hf_side.HFSideError, FileNotFoundError, ValueError) as e:
        print(f"agreement: error: {e}", file=sys.stderr)
        return 2
    report["command"] = hardware.command_line("tools/agreement.py", argv)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1))
    summary = {k: round(v["prefix_agreement"], 4) for k, v in report["pairs"].items()}
    summary.update({f"forced_{k}": round(v["forced_agreement"], 4) for k, v in report["forced"].items() if v})
    close = report["as_close_as_hf"]
    print(json.dumps({"prefix_agreement": summary, "target_met": report["target"]["met"],
                      "as_close_as_hf": close and close["met"], "out": str(a.out)}))
    if a.min_agreement is not None and report["target"]["value"] < a.min_agreement:
        print(f"agreement: ours_vs_hf prefix agreement {report['target']['value']:.4f} is below "
              f"--min-agreement {a.min_agreement}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
