"""Admission on the GPU thread: an Admit command turned into the request's sequences, its sampling
parameters converted, once, into what the sampler takes (engine.draw_params).

Every limit of a request is checked where the request is parsed: the HTTP protocol with the
contract's bounds (daemon/protocol.py), the vocabulary, the context and the KV slots once the model
is known (daemon/completions.py). Here the engine only asserts the invariants it relies on (prompt
ids inside the vocabulary, the context limit, a KV slot for every choice, room in the whole KV cache
for the request at its longest (so preempting the others always lets it finish), parameters inside the
sampler's domain). A violated invariant is a bug upstream, never a user's error: it is logged as
one, and it fails that request alone (RequestError, a Failed event) before it holds a KV slot, so
that no step ever meets a value it cannot run and the engine goes on (DESIGN.md, fault isolation)."""
from __future__ import annotations

import random

from pegainfer.engine.contract import Admit
from pegainfer.engine.draw_params import DrawParams
from pegainfer.engine.engine import Engine, RequestError
from pegainfer.engine.kv_capacity import request_pages
from pegainfer.engine.sequence import Group, Sequence
from pegainfer.engine.startup_log import log_event

_SEEDS = random.SystemRandom()  # seeds for requests that bring none


def admit(cmd: Admit, engine: Engine) -> Sequence:
    """The request's first sequence, carrying its n-1 siblings until the shared prefill. Raises
    RequestError, naming the invariant, for anything the engine cannot run."""
    try:
        return _sequences(cmd, engine)
    except Exception as e:  # noqa: BLE001 - host checks of this request's own values: it alone fails
        why = str(e) if isinstance(e, RequestError) else f"invalid request: {type(e).__name__}: {e}"
        log_event("admit_invariant_violated", request_id=cmd.request_id, error=why)
        raise RequestError(why) from None


def runnable(prompt_ids: list[int], max_tokens: int, engine: Engine) -> None:
    """The invariants of any prompt the engine runs (engine.generate's too): RequestError if broken."""
    vocab = engine.cfg.vocab_size
    _invariant(bool(prompt_ids), "the prompt is empty")
    bad = next((t for t in prompt_ids if not 0 <= t < vocab), None)
    _invariant(bad is None, f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
    _invariant(max_tokens >= 1, f"max_tokens must be at least 1, got {max_tokens}")
    _invariant(len(prompt_ids) + max_tokens <= engine.max_model_len,
               f"prompt of {len(prompt_ids)} tokens plus max_tokens {max_tokens} exceeds the context limit of "
               f"{engine.max_model_len} tokens")


def _invariant(holds: bool, what: str) -> None:
    if not holds:
        raise RequestError(what)


def _sequences(cmd: Admit, engine: Engine) -> Sequence:
    runnable(cmd.prompt_ids, cmd.max_tokens, engine)
    cache, vocab = engine.cache, engine.cfg.vocab_size
    slots = cache.num_slots
    _invariant(not isinstance(cmd.n, bool) and isinstance(cmd.n, int) and 1 <= cmd.n <= slots,
               f"{cmd.n} choices need {cmd.n} KV slots; the engine has {slots}")
    need = request_pages(len(cmd.prompt_ids), cmd.max_tokens, cmd.n, cache.page_size)
    _invariant(need <= cache.num_pages, f"the request needs up to {need} KV pages; the whole cache has "
               f"{cache.num_pages}")
    seed = cmd.sampling.seed if cmd.sampling.seed is not None else _SEEDS.getrandbits(64)
    _invariant(not isinstance(seed, bool) and isinstance(seed, int),
               f"the seed must be an integer, got {type(seed).__name__}")
    seed = (seed + 2**63) % 2**64 - 2**63  # any integer -> a signed 64-bit one
    try:
        params = DrawParams.of(cmd.sampling, seed, vocab)
    except (TypeError, ValueError) as e:
        raise RequestError(f"sampling parameters outside what the engine runs: {e}") from None
    n = cmd.sampling.prompt_logprobs
    _invariant(n is None or (not isinstance(n, bool) and isinstance(n, int) and 0 <= n <= vocab),
               f"prompt_logprobs must be in [0, {vocab}], got {n!r}")
    stops = frozenset(cmd.stop_token_ids)
    group = Group(cmd.request_id, live=cmd.n)
    prompt = list(cmd.prompt_ids)
    seqs = [Sequence(cmd.request_id, prompt, cmd.max_tokens, cmd.ignore_eos, index=i, sampling=cmd.sampling,
                     seed=seed, params=params, stop_token_ids=stops, group=group) for i in range(cmd.n)]
    seqs[0].forks = seqs[1:]
    return seqs[0]
