"""Admission on the GPU thread: an Admit command checked against the engine (prompt ids within the
vocabulary, the context limit, KV slots for its choices) and its sampling parameters converted,
once, into what the sampler takes (engine.draw_params), giving the request's sequences. Whatever is
wrong with a request fails that request alone (RequestError, a Failed event), before it holds a KV
slot, so no step ever meets a value it cannot run."""
from __future__ import annotations

import random

from engine.draw_params import DrawParams
from engine.engine import Engine, RequestError
from engine.contract import Admit
from engine.sequence import Group, Sequence

_SEEDS = random.SystemRandom()  # seeds for requests that bring none


def admit(cmd: Admit, engine: Engine) -> Sequence:
    """The request's first sequence, carrying its n-1 siblings until the shared prefill. Raises
    RequestError, naming what is wrong, for anything the engine cannot run."""
    try:
        return _sequences(cmd, engine)
    except RequestError:
        raise
    except Exception as e:  # noqa: BLE001 - host checks of this request's own values: it alone fails
        raise RequestError(f"invalid request: {type(e).__name__}: {e}") from None


def _sequences(cmd: Admit, engine: Engine) -> Sequence:
    engine.check_request(cmd.prompt_ids, cmd.max_tokens)
    slots, vocab = engine.cache.num_slots, engine.cfg.vocab_size
    if isinstance(cmd.n, bool) or not isinstance(cmd.n, int) or not 1 <= cmd.n <= slots:
        raise RequestError(f"{cmd.n} choices need {cmd.n} KV slots; the engine has {slots}")
    seed = cmd.sampling.seed if cmd.sampling.seed is not None else _SEEDS.getrandbits(64)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise RequestError(f"the seed must be an integer, got {type(seed).__name__}")
    seed = (seed + 2**63) % 2**64 - 2**63  # any integer -> a signed 64-bit one
    try:
        params = DrawParams.of(cmd.sampling, seed, vocab)
    except (TypeError, ValueError) as e:
        raise RequestError(f"sampling parameters outside what the engine runs: {e}") from None
    n = cmd.sampling.prompt_logprobs
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= vocab):
        raise RequestError(f"prompt_logprobs must be in [0, {vocab}], got {n!r}")
    stops = frozenset(cmd.stop_token_ids)
    group = Group(cmd.request_id, live=cmd.n)
    prompt = list(cmd.prompt_ids)
    seqs = [Sequence(cmd.request_id, prompt, cmd.max_tokens, cmd.ignore_eos, index=i, sampling=cmd.sampling,
                     seed=seed, params=params, stop_token_ids=stops, group=group) for i in range(cmd.n)]
    seqs[0].forks = seqs[1:]
    return seqs[0]
