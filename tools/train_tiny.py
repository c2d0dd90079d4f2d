"""Train a small DeepSeek-V2 (the real architecture at toy width) on the Python standard library's
sources and write it as an HF-format checkpoint folder that pegainfer serves:

    python tools/train_tiny.py --out DIR [--device cpu|cuda] [--minutes M] [--steps N] [--batch B]
        [--seq-len T] [--lr LR] [--seed S] [--threads K] [--max-files F] [--max-chars C]

The model is DeepSeek-V2-Lite's config.json at small shapes (engine/presets.py "lite" plus
TRAINED_OVERRIDES): MLA without q-LoRA, Lite's YaRN rope scaling, layer 0 dense, layers 1..3 MoE with
16 routed experts (greedy top-4, softmax gate, norm_topk_prob false) and 2 shared experts. It trains
transformers' DeepseekV2ForCausalLM (the reference implementation) with AdamW, a warm-up then cosine
learning rate over --steps, and a load-balancing loss on the routers. The tokenizer is the project's
byte-level BPE (engine/checkpoint_writer.train_bpe) learned from the same corpus.

--steps fixes the schedule (reproducible: same seed, corpus, device and steps give the same weights
on CPU); --minutes is a wall-clock cap on the training loop, which stops early and says so.
DIR gets the checkpoint plus training.json (arguments, corpus file list and hash, licence, losses),
loss.jsonl (the loss curve, one JSON object per logged step) and loss.png (when matplotlib is
installed). Bad input prints one line on stderr and exits 2.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import NoReturn

if __package__ in (None, ""):  # run as a script: make the repository's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROG = "train_tiny"
VOCAB = 4096  # 4094 BPE tokens learned from the corpus, then BOS and EOS
TRAINED_OVERRIDES: dict = {
    "vocab_size": VOCAB, "bos_token_id": VOCAB - 2, "eos_token_id": VOCAB - 1,
    "hidden_size": 128, "intermediate_size": 512, "moe_intermediate_size": 64,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
    "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
    "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 2,
    "torch_dtype": "float32",
}
AUX_WEIGHT = 0.01  # load-balancing loss (Switch Transformer form), so no expert starves


def fail(message: str) -> NoReturn:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(2)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        fail(message)


def model_config() -> dict:
    from pegainfer.engine.presets import preset_config
    return {**preset_config("lite"), **json.loads(json.dumps(TRAINED_OVERRIDES))}


def tokenize(corpus, tokenizer_json: str):
    """(train stream, val stream, line-start positions of the train stream): every file's ids then
    EOS, concatenated; a training row starts at the first token of a line, as prompts do."""
    import torch
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(tokenizer_json)
    eos = VOCAB - 1
    train, val = corpus.split()

    def stream(texts: list[str]) -> torch.Tensor:
        ids: list[int] = []
        for enc in tok.encode_batch(texts, add_special_tokens=False):
            ids += enc.ids + [eos]
        return torch.tensor(ids, dtype=torch.long)

    newline = torch.tensor(["\u010a" in tok.id_to_token(i) if tok.id_to_token(i) else False for i in range(VOCAB)])
    tr = stream(train)
    starts = (torch.nonzero(newline[tr[:-1]]).flatten() + 1)
    return tr, stream(val), starts


def batch_rows(stream, starts, idx, seq_len: int, bos: int):
    """[B, T+1] rows: BOS then seq_len tokens of the stream from each start (clipped to the end)."""
    import torch
    s = starts[idx].clamp(max=len(stream) - seq_len)  # [B]
    body = stream[s[:, None] + torch.arange(seq_len)[None, :]]  # [B, T]
    return torch.cat([torch.full((len(idx), 1), bos, dtype=torch.long), body], dim=1)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def train(args) -> dict:
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    from pegainfer.engine.checkpoint_writer import build_tokenizer, train_bpe
    from tools.trainkit.corpus import load_corpus

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.monotonic()
    corpus = load_corpus(max_files=args.max_files, max_chars=args.max_chars)
    train_texts, _ = corpus.split()
    bpe = train_bpe((line for t in train_texts for line in t.splitlines(keepends=True)), VOCAB - 2)
    tokenizer_json = build_tokenizer(VOCAB, VOCAB - 2, VOCAB - 1, bpe=bpe).to_str()
    stream, val_stream, starts = tokenize(corpus, tokenizer_json)
    config = model_config()
    hf_cfg = DeepseekV2Config(**{k: v for k, v in config.items() if k not in ("torch_dtype", "architectures")})
    model = DeepseekV2ForCausalLM(hf_cfg).to(args.device)  # HF's init: N(0, 0.02), norms 1, router N(0, 0.02)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "gate.weight" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "gate.weight" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    routers = _router_taps(model)
    gen = torch.Generator().manual_seed(args.seed)
    val_gen = torch.Generator().manual_seed(args.seed + 1)
    val_starts = torch.arange(0, max(1, len(val_stream) - args.seq_len), max(1, args.seq_len))
    val_idx = torch.randperm(len(val_starts), generator=val_gen)[:args.batch]
    val_rows = batch_rows(val_stream, val_starts, val_idx, args.seq_len, VOCAB - 2).to(args.device)
    curve: list[dict] = []
    log = open(args.out_log, "w", encoding="utf-8") if args.out_log else None
    deadline = time.monotonic() + args.minutes * 60
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if args.device.startswith("cuda") else _Null()
    step, stopped = 0, "steps"
    train_t0 = time.monotonic()
    while step < args.steps:
        if time.monotonic() > deadline:
            stopped = "minutes"
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        rows = batch_rows(stream, starts, torch.randint(len(starts), (args.batch,), generator=gen),
                          args.seq_len, VOCAB - 2).to(args.device)  # [B, T+1]
        routers.clear()
        with amp:
            logits = model(input_ids=rows[:, :-1], use_cache=False).logits  # [B, T, V]
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), rows[:, 1:].reshape(-1))
        aux = _balance_loss(routers, config["n_routed_experts"])
        opt.zero_grad(set_to_none=True)
        (loss + AUX_WEIGHT * aux).backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.log_every == 0 or step == args.steps or step == 1:
            rec = {"step": step, "tokens": step * args.batch * args.seq_len, "loss": round(loss.item(), 4),
                   "aux": round(aux.item(), 4), "grad_norm": round(gnorm.item(), 3),
                   "lr": round(opt.param_groups[0]["lr"], 6), "elapsed_s": round(time.monotonic() - train_t0, 1)}
            if step % (args.log_every * 5) == 0 or step == args.steps:
                rec["val_loss"] = round(_val_loss(model, val_rows, amp), 4)
            curve.append(rec)
            if log:
                log.write(json.dumps(rec) + "\n")
                log.flush()
            print(json.dumps(rec), file=sys.stderr, flush=True)
    if log:
        log.close()
    final_val = _val_loss(model, val_rows, amp)
    if not curve or curve[-1]["step"] != step:
        curve.append({"step": step, "tokens": step * args.batch * args.seq_len, "loss": round(loss.item(), 4),
                      "elapsed_s": round(time.monotonic() - train_t0, 1)})
    curve[-1]["val_loss"] = round(final_val, 4)
    record = {"command": " ".join(["python", "tools/train_tiny.py", *args.argv]), "seed": args.seed,
              "device": args.device, "threads": args.threads, "steps_planned": args.steps, "steps_done": step,
              "stopped_by": stopped, "batch": args.batch, "seq_len": args.seq_len, "peak_lr": args.lr,
              "warmup": args.warmup, "aux_weight": AUX_WEIGHT, "parameters": n_params,
              "train_tokens_seen": step * args.batch * args.seq_len, "train_stream_tokens": len(stream),
              "final_train_loss": curve[-1]["loss"], "final_val_loss": round(final_val, 4),
              "train_wall_s": round(time.monotonic() - train_t0, 1), "total_wall_s": round(time.monotonic() - t0, 1),
              "torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "corpus": corpus.manifest()}
    return {"record": record, "curve": curve, "config": config, "state": model.state_dict(),
            "tokenizer_json": tokenizer_json}


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _router_taps(model) -> list:
    """Forward hooks on every MoE router; the list collects (router_logits [N, E], top-k idx [N, k])."""
    taps: list = []
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "top_k"):
            gate.register_forward_hook(lambda _m, _i, out: taps.append((out[0], out[2])))
    return taps


def _balance_loss(taps: list, n_experts: int):
    """E * sum_e f_e * p_e per MoE layer (1.0 when balanced), averaged over layers."""
    import torch
    losses = []
    for logits, idx in taps:
        p = logits.float().softmax(-1).mean(0)  # [E]
        f = torch.zeros(n_experts, device=logits.device).index_add_(
            0, idx.flatten(), torch.ones(idx.numel(), device=logits.device)) / idx.numel()
        losses.append(n_experts * (f * p).sum())
    return torch.stack(losses).mean()


def _val_loss(model, rows, amp) -> float:
    import torch
    model.eval()
    with torch.no_grad(), amp:
        logits = model(input_ids=rows[:, :-1], use_cache=False).logits
    model.train()
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), rows[:, 1:].reshape(-1)).item()


def plot(curve: list[dict]) -> bytes | None:
    """The loss curve as PNG bytes, or None when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    import io
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([c["tokens"] for c in curve], [c["loss"] for c in curve], label="train")
    val = [c for c in curve if "val_loss" in c]
    ax.plot([c["tokens"] for c in val], [c["val_loss"] for c in val], "o-", label="validation (held-out files)")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("tools/train_tiny.py")
    ax.legend()
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def parse(argv: list[str]) -> argparse.Namespace:
    p = _Parser(prog=PROG, description="Train a small DeepSeek-V2 on the Python standard library's sources.")
    p.add_argument("--out", required=True, type=Path, help="checkpoint folder to create (must not exist, or be empty)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--minutes", type=float, default=8.0, help="wall-clock cap on the training loop (default 8)")
    p.add_argument("--steps", type=int, default=2000, help="optimizer steps; the learning-rate schedule spans them")
    p.add_argument("--batch", type=int, default=16, help="rows per step")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per row (after BOS)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=100, help="warm-up steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--log-every", type=int, default=10, help="log the loss every N steps")
    p.add_argument("--max-files", type=int, default=None, help="use only the first F corpus files (toy runs)")
    p.add_argument("--max-chars", type=int, default=None, help="stop adding corpus files after C characters")
    a = p.parse_args(argv)
    for name in ("steps", "batch", "seq_len", "warmup", "log_every"):
        if getattr(a, name) < 1:
            fail(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(a, name)}")
    for name in ("max_files", "max_chars"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            fail(f"--{name.replace('_', '-')} must be a positive integer")
    if not (a.minutes > 0 and math.isfinite(a.minutes)):
        fail(f"--minutes must be a positive number, got {a.minutes}")
    if not (a.lr > 0 and math.isfinite(a.lr)):
        fail(f"--lr must be a positive number, got {a.lr}")
    if a.threads < 0:
        fail(f"--threads must be >= 0, got {a.threads}")
    if a.device != "cpu" and not a.device.startswith("cuda"):
        fail(f"--device must be cpu or cuda[:N], got {a.device!r}")
    if a.out.exists() and (not a.out.is_dir() or any(a.out.iterdir())):
        fail(f"{a.out} already exists and is not empty")
    a.argv = argv
    return a


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    import torch
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {args.device}: no CUDA device is visible")
    from tools.trainkit.export import write_trained_checkpoint
    args.out_log = None
    try:
        result = train(args)
    except ValueError as e:  # an empty corpus
        fail(str(e))
    curve_text = "".join(json.dumps(c) + "\n" for c in result["curve"])
    extra: dict[str, str | bytes] = {"training.json": json.dumps(result["record"], indent=1) + "\n", "loss.jsonl": curve_text}
    png = plot(result["curve"])
    if png is not None:
        extra["loss.png"] = png
    result["record"]["plot"] = "loss.png" if png is not None else "not written: matplotlib is not installed"
    extra["training.json"] = json.dumps(result["record"], indent=1) + "\n"
    try:
        path = write_trained_checkpoint(args.out, config=result["config"], state=result["state"],
                                        tokenizer_json=result["tokenizer_json"], extra_files=extra)
    except FileExistsError as e:
        fail(str(e))
    print(json.dumps({"out": str(path), "steps": result["record"]["steps_done"],
                      "final_val_loss": result["record"]["final_val_loss"], "stopped_by": result["record"]["stopped_by"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
