"""`pegainfer generate`: load the engine, run one prompt (greedy, or sampled with --temperature and
its companions, seeded), print the result. The sampling flags are checked against the API's bounds
before anything loads; the prompt and max_tokens once the model's limits are known."""
from __future__ import annotations

import argparse

import orjson

from pegainfer.daemon.errors import CliError
from pegainfer.daemon.startup_check import check_device, check_model_dir

from pegainfer.engine.contract import ParamError, SamplingParams, check
from pegainfer.engine.engine import Engine, EngineSpec, build_engine, default_model_dir
from pegainfer.engine.generate import generate
from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.tokenizer import Tokenizer
from pegainfer.ep.preflight import preflight


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise CliError("--prompt-ids is empty")
    return ids


def _check_limits(prompt_ids: list[int], max_tokens: int, engine: Engine) -> None:
    """The request's limits against the loaded model; a ParamError (one line) names the broken one."""
    vocab, limit = engine.cfg.vocab_size, engine.max_model_len
    bad = next((t for t in prompt_ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise ParamError("prompt", f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
    if len(prompt_ids) + max_tokens > limit:
        raise ParamError("prompt", f"prompt of {len(prompt_ids)} tokens plus max_tokens {max_tokens} exceeds the "
                                   f"context limit of {limit} tokens")


def run_generate(args: argparse.Namespace) -> int:
    # Before loading: one line on what to change (exit 2), in the order `serve` checks its settings.
    try:
        sampling = SamplingParams.checked(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                          min_p=args.min_p, seed=args.seed)
        check("max_tokens", args.max_tokens)
        prompt_ids = parse_ids(args.prompt_ids) if args.prompt_ids is not None else None
        for t in prompt_ids or ():
            check("--prompt-ids", t, "token_id")
    except ParamError as e:
        raise CliError(str(e)) from None  # a command line that cannot work: exit 2, nothing loaded
    preflight(args.backend, args.device, args.ep_size)
    check_device(args.device)
    if args.model:
        check_model_dir(args.model)
    model_dir = str(args.model or default_model_dir())
    tok = Tokenizer(model_dir)
    if prompt_ids is None:
        prompt_ids = tok.encode(args.prompt)
    spec = EngineSpec(model_dir=model_dir, device=args.device, dtype=args.dtype, backend=args.backend,
                      ep_size=args.ep_size, num_slots=1,
                      kernels=KernelConfig(batch_invariant=args.batch_invariant))
    engine = build_engine(spec)
    try:
        _check_limits(prompt_ids, args.max_tokens, engine)
        [out] = generate(engine, [prompt_ids], args.max_tokens, ignore_eos=args.ignore_eos, sampling=sampling)
    finally:
        engine.close()
    text = tok.decode(out.token_ids)
    if args.json:
        print(orjson.dumps({"token_ids": out.token_ids, "text": text, "finish_reason": out.finish_reason,
                            "prompt_tokens": len(prompt_ids), "backend": engine.backend_name,
                            "maturity": engine.maturity, "batch_invariant": engine.batch_invariant}).decode())
    else:
        print(text)
    return 0
