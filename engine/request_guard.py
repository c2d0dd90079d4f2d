"""Keeps a fault that belongs to one request's inputs to that request during a step (DESIGN.md,
fault isolation; engine.admission does the same when a request arrives).

The per-request work after the forward (choosing each draw's token, a prompt chunk's log-probs)
runs under this guard: when it raises on one request's values, the draws or rows that raise on their
own are found and fail alone, and the rest of the step goes on with the same tokens it would have
had (a draw depends only on its own row, seed and step). A device or rank fault is never caught
here: it fails the step, and the engine, as before."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import torch

from pegainfer.engine.sampler import Draw, Sampled, SamplingBatch, sample
from pegainfer.ep.backend import RankFailure

T = TypeVar("T")


def device_fault(e: BaseException) -> bool:
    """A fault of the device or of an expert rank, never of one request's values: it fails the step."""
    accelerator = getattr(torch, "AcceleratorError", None)  # torch >= 2.8: a CUDA error
    return (isinstance(e, (RankFailure, torch.cuda.OutOfMemoryError))
            or (accelerator is not None and isinstance(e, accelerator)) or "CUDA" in str(e))


def choose(logits: torch.Tensor, draws: list[Draw]) -> tuple[Sampled | None, list[int], dict[int, str]]:
    """Sample every draw in one batched call. When that raises on a request's values, the draws that
    raise alone fail, and the others are sampled again without them. Returns (what the kept draws
    sampled, their indices in `draws`, failed draw index -> why). A fault no single draw reproduces,
    or a device fault, is raised: the step fails."""
    vocab, device = logits.shape[-1], logits.device
    if not draws:  # only prompt chunks before their last: nothing to choose yet
        return None, [], {}
    try:
        return sample(logits, SamplingBatch.build(draws, vocab, device)), list(range(len(draws))), {}
    except Exception as e:  # noqa: BLE001 - re-raised below unless one request's values cause it
        if device_fault(e):
            raise
        failed = {i: why for i, d in enumerate(draws)
                  if (why := _fails_alone(lambda: sample(logits, SamplingBatch.build([d], vocab, device))))}
        if not failed:
            raise
    kept = [i for i in range(len(draws)) if i not in failed]
    out = sample(logits, SamplingBatch.build([draws[i] for i in kept], vocab, device)) if kept else None
    return out, kept, failed


def per_row(compute: Callable[[int], T], rows: Iterable[int]) -> tuple[dict[int, T], dict[int, str]]:
    """compute(r) for every row, each under the guard: (row -> result, failed row -> why)."""
    done: dict[int, T] = {}
    failed: dict[int, str] = {}
    for r in rows:
        holder: list[T] = []
        why = _fails_alone(lambda: holder.append(compute(r)))
        if why:
            failed[r] = why
        else:
            done[r] = holder[0]
    return done, failed


def _fails_alone(work: Callable[[], object]) -> str | None:
    """Run one request's share of a step: None when it succeeds, why when it raises on the
    request's values (a device fault propagates)."""
    try:
        work()
    except Exception as e:  # noqa: BLE001 - device faults are re-raised; the rest is this request's
        if device_fault(e):
            raise
        return f"{type(e).__name__}: {e}"
    return None
