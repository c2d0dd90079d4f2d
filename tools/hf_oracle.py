"""The correctness gate: HF transformers' DeepseekV2ForCausalLM against pegainfer, greedy, on the
committed case set; token- and text-exact or it names the first divergence.

    python tools/hf_oracle.py --model DIR [--engine-model DIR] [--cases tests/data/cases.json]
        [--backend local] [--ep-size N] [--device cpu] [--dtype float32] --out REPORT.json
    python tools/hf_oracle.py --variants all --out REPORT.json   # tiny model and its config variants

HF loads the checkpoint itself (per-expert names converted by from_pretrained); the gate fails if it
reports any missing, unexpected or mismatched weight, or if a loaded parameter differs from the file.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from pegainfer.engine.engine import EngineSpec, build_engine  # noqa: E402
from pegainfer.engine.generate import generate  # noqa: E402
from pegainfer.engine.tokenizer import IncrementalDetokenizer, Tokenizer  # noqa: E402
from pegainfer.ep.preflight import REFUSALS, preflight  # noqa: E402
from tools.benchkit import hardware  # noqa: E402

DEFAULT_CASES = ROOT / "tests" / "data" / "cases.json"

# The config variants of the tiny model the gate also runs (issue: foundation).
VARIANTS: dict[str, dict] = {
    "base": {},
    "q_lora": {"q_lora_rank": 16},
    "group_limited_greedy": {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2},
    "norm_topk_prob": {"norm_topk_prob": True},
    "routed_scaling": {"routed_scaling_factor": 2.5},
    "first_k_dense_2": {"first_k_dense_replace": 2},
    # transformers reads `"rope_scaling": null` as its own YaRN default; "default" means plain RoPE to both.
    "rope_none": {"rope_scaling": {"rope_type": "default", "type": "default"}},
}


class GateError(RuntimeError):
    """The oracle cannot be trusted for this checkpoint (HF re-initialised or mis-loaded a weight)."""


def checkpoint_hash(model_dir: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(model_dir.iterdir()):
        if p.is_file():
            h.update(p.name.encode())
            with p.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


def _hash_json(obj) -> str:
    return hashlib.sha256(json.dumps(obj, ensure_ascii=False, sort_keys=True).encode()).hexdigest()


def load_hf(model_dir: Path, dtype: torch.dtype, device: str):
    """Load through from_pretrained and prove every parameter came from the file."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise GateError(f"HF loading reported {problems}")
    params = dict(model.named_parameters())
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"]
    for shard in sorted(set(index.values())):
        with safe_open(str(model_dir / shard), framework="pt") as f:
            for name in f.keys():
                _check_param(params, name, f.get_tensor(name))
    return model.to(device).eval()


def _check_param(params: dict, name: str, on_disk: torch.Tensor) -> None:
    parts = name.split(".")
    if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
        i = parts.index("experts")
        e, proj = int(parts[i + 1]), parts[i + 2]
        prefix = ".".join(parts[:i + 1])
        if proj == "down_proj":
            got = params[f"{prefix}.down_proj"][e]
        else:
            fused = params[f"{prefix}.gate_up_proj"][e]
            half = fused.shape[0] // 2
            got = fused[:half] if proj == "gate_proj" else fused[half:]
    else:
        got = params.get(name)
        if got is None:
            raise GateError(f"HF has no parameter for checkpoint tensor {name}")
    if not torch.equal(got.detach().cpu(), on_disk.to(got.dtype)):
        raise GateError(f"HF parameter for {name} differs from the checkpoint (re-initialised?)")


@contextlib.contextmanager
def hf_norm_topk_patch(model, enabled: bool):
    """transformers' DeepseekV2 router ignores norm_topk_prob; DeepSeek-V2's published code (and vLLM,
    SGLang, pegainfer) renormalise the top-k weights when it is set. Apply that to HF for the variant."""
    if not enabled:
        yield []
        return
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as m
    original = m.DeepseekV2TopkRouter.forward

    def forward(self, hidden_states):
        logits, w, idx = original(self, hidden_states)
        w = w / self.routed_scaling_factor
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return logits, w * self.routed_scaling_factor, idx

    m.DeepseekV2TopkRouter.forward = forward
    try:
        yield ["norm_topk_prob renormalisation applied to transformers' router (it ignores the flag)"]
    finally:
        m.DeepseekV2TopkRouter.forward = original


def hf_greedy(model, prompt: list[int], max_tokens: int, device: str) -> list[int]:
    ids = torch.tensor([prompt], device=device)  # [1, P]
    # An explicit mask: without one, generate() masks every prompt token equal to pad_token_id as padding
    # (id 0 is "!" in the byte-level BPEs here, so "!!!" in a prompt changed HF's answer).
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, min_new_tokens=0,
                         do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def stream_text(tok: Tokenizer, ids: list[int]) -> str:
    d = IncrementalDetokenizer(tok)
    return "".join(d.push(t) for t in ids) + d.flush()


def load_cases(path: Path, tok: Tokenizer) -> list[dict]:
    raw = json.loads(path.read_text())["cases"]
    cases = []
    for c in raw:
        prompts = c.get("prompt_ids") or [tok.encode(p) for p in c["prompts"]]
        cases.append({"name": c["name"], "prompts": prompts, "max_tokens": c["max_tokens"]})
    return cases


def run_gate(model_dir: Path, *, engine_dir: Path | None = None, cases_path: Path = DEFAULT_CASES,
             backend: str = "local", ep_size: int = 1, device: str = "cpu", dtype: str = "float32") -> dict:
    """Compare HF (from model_dir) with pegainfer (from engine_dir, default the same folder)."""
    engine_dir = engine_dir or model_dir
    tok = Tokenizer(str(model_dir))
    cases = load_cases(cases_path, tok)
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    hf = load_hf(model_dir, tdtype, device)
    cfg = json.loads((model_dir / "config.json").read_text())
    engine = build_engine(EngineSpec(model_dir=str(engine_dir), device=device, dtype=dtype, backend=backend,
                                     ep_size=ep_size, num_slots=max(len(c["prompts"]) for c in cases)))
    report_cases, all_ours, all_text, first, matched, total = [], [], [], None, 0, 0
    try:
        with hf_norm_topk_patch(hf, bool(cfg.get("norm_topk_prob"))) as patches:
            for case in cases:
                ours = generate(engine, case["prompts"], case["max_tokens"], ignore_eos=True)
                rows = []
                for r, (prompt, g) in enumerate(zip(case["prompts"], ours)):
                    ref = hf_greedy(hf, prompt, case["max_tokens"], device)
                    ref_text, our_text = tok.decode(ref), stream_text(tok, g.token_ids)
                    row = {"row": r, "prompt_tokens": len(prompt), "tokens": len(ref)}
                    step = next((i for i, (a, b) in enumerate(zip(ref, g.token_ids)) if a != b), None)
                    if step is None and len(ref) != len(g.token_ids):
                        step = min(len(ref), len(g.token_ids))
                    n_match = len(ref) if step is None else step
                    matched, total = matched + n_match, total + len(ref)
                    if step is not None:
                        div = {"case": case["name"], "row": r, "step": step,
                               "hf_token": ref[step] if step < len(ref) else None,
                               "pegainfer_token": g.token_ids[step] if step < len(g.token_ids) else None}
                        row["classification"], row["divergence"] = "token_divergence", div
                        first = first or div
                    elif ref_text != our_text:
                        row["classification"] = "text_divergence"
                        first = first or {"case": case["name"], "row": r, "step": None, "text": [ref_text, our_text]}
                    else:
                        row["classification"] = "token_text_exact"
                    all_ours.append(g.token_ids)
                    all_text.append(our_text)
                    rows.append(row)
                exact = all(x["classification"] == "token_text_exact" for x in rows)
                report_cases.append({"name": case["name"], "batch_rows": len(rows), "max_tokens": case["max_tokens"],
                                     "classification": "all_token_text_exact" if exact else "divergence", "rows": rows})
    finally:
        engine.close()
    return {
        "report_intent": "correctness",
        "checkpoint_hash": checkpoint_hash(model_dir),
        "engine_checkpoint_hash": checkpoint_hash(engine_dir) if engine_dir != model_dir else None,
        "case_count": len(cases),
        "row_count": sum(len(c["prompts"]) for c in cases),
        "classification": "all_token_text_exact" if first is None else "divergence",
        "first_divergence": first,
        "token_agreement": matched / total if total else 1.0,
        "token_hash": _hash_json(all_ours),
        "text_hash": _hash_json(all_text),
        "backend": engine.backend_name,
        "maturity": engine.maturity,
        "batch_invariant": engine.batch_invariant,
        "ep_size": ep_size,
        "device": device,
        "dtype": dtype,
        "oracle_patches": patches,
        "transformers_version": __import__("transformers").__version__,
        "cases": report_cases,
    }


def run_variants(names: list[str], **kw) -> dict:
    from pegainfer.engine.checkpoint_writer import write_checkpoint
    reports = {}
    with tempfile.TemporaryDirectory(prefix="pegainfer-oracle-") as tmp:
        for name in names:
            d = write_checkpoint(Path(tmp) / name, "tiny", seed=0, overrides=VARIANTS[name])
            reports[name] = run_gate(Path(d), **kw)
    ok = all(r["classification"] == "all_token_text_exact" for r in reports.values())
    return {"report_intent": "correctness", "classification": "all_token_text_exact" if ok else "divergence",
            "variants": reports}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="checkpoint folder for HF (and pegainfer unless --engine-model)")
    p.add_argument("--engine-model", type=Path, help="checkpoint folder pegainfer loads instead")
    p.add_argument("--variants", help="comma-separated tiny-model variants, or 'all' (instead of --model)")
    p.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    p.add_argument("--backend", default="local")
    p.add_argument("--ep-size", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    kw = dict(cases_path=a.cases, backend=a.backend, ep_size=a.ep_size, device=a.device, dtype=a.dtype)
    try:
        preflight(a.backend, a.device, a.ep_size)  # before HF or the engine loads anything
        if a.variants:
            names = list(VARIANTS) if a.variants == "all" else a.variants.split(",")
            unknown = [n for n in names if n not in VARIANTS]
            if unknown:
                raise GateError(f"unknown variant {unknown[0]!r} (known: {', '.join(VARIANTS)})")
            report = run_variants(names, **kw)
        elif a.model:
            report = run_gate(a.model, engine_dir=a.engine_model, **kw)
        else:
            raise GateError("give --model DIR or --variants")
    except (GateError, *REFUSALS) as e:
        print(f"hf_oracle: error: {e}", file=sys.stderr)
        return 2
    report["command"] = hardware.command_line("tools/hf_oracle.py", argv)  # secrets redacted
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1, ensure_ascii=False))
    print(json.dumps({"classification": report["classification"], "out": str(a.out)}))
    return 0 if report["classification"] == "all_token_text_exact" else 1


if __name__ == "__main__":
    sys.exit(main())
