"""Batch invariance through the GPU thread on the tiny model (CPU, float32 and bfloat16): a probe
request's token ids and log-probs (generated and prompt) are bitwise the same alone and inside
crowds of 2, 7, 33 and 64 other requests of mixed lengths and sampling settings, with its prompt
packed beside others or cut into chunks (--max-prefill-tokens), greedy and seeded, with async
scheduling on and off. And the opt-out is honest: --no-batch-invariant still serves correctly."""
from __future__ import annotations

import pytest

from pegainfer.engine.contract import Admit
from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.kernels.config import KernelConfig
from tests.engine.invariance_cases import PROBE_PROMPT, PROBES, Seen, assert_probes_equal, crowd, serve
from tests.engine.invariance_cases import alone as alone_run


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def engine(request, tiny_model_dir):
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), dtype=request.param, num_slots=72,
                                max_model_len=256))
    assert e.batch_invariant
    yield e
    e.close()


@pytest.fixture(scope="module")
def alone(engine) -> Seen:
    return alone_run(engine)


@pytest.mark.parametrize(("size", "overlap", "max_prefill"), [
    (2, True, 8192), (7, False, 8192), (33, True, 40), (64, False, 8192), (64, True, 13),
])
def test_a_request_is_the_same_alone_and_in_a_crowd(engine, alone, size, overlap, max_prefill):
    others = crowd(size, seed=size, vocab=engine.cfg.vocab_size)
    # probes first, in the middle and last: different rows, packed beside different prompts
    admits = [PROBES[0], *others[:size // 2], PROBES[1], *others[size // 2:]]
    got = serve(engine, admits, overlap=overlap, max_prefill_tokens=max_prefill)
    assert_probes_equal(got, alone, f"in a crowd of {size} (overlap {overlap}, max_prefill_tokens {max_prefill})")


@pytest.mark.parametrize("max_prefill", [1, 3, 17])
def test_a_prompt_cut_into_chunks_gives_the_same_request(engine, alone, max_prefill):
    got = serve(engine, list(PROBES), max_prefill_tokens=max_prefill)
    assert_probes_equal(got, alone, f"chunked by max_prefill_tokens {max_prefill}")


def test_a_request_arriving_while_others_decode_is_the_same(engine, alone):
    """The probes join a running batch: their prompts prefill in a mixed step beside decode rows."""
    got = serve(engine, crowd(9, seed=3, vocab=engine.cfg.vocab_size), later=list(PROBES), after_steps=3)
    assert_probes_equal(got, alone, "joining rows that decode")


def test_a_request_beside_prompts_cut_by_the_mixed_step_budget_is_the_same(engine, alone):
    """mixed_step_tokens 70 beside decode rows: each step takes at most 64 prompt tokens, so the crowd's
    longer prompts are cut into chunks while one probe decodes, and the other probe waits behind them."""
    others = crowd(9, seed=5, vocab=engine.cfg.vocab_size)
    assert sum(len(a.prompt_ids) for a in others) > 3 * 64  # several steps of cut prompts
    got = serve(engine, [PROBES[0]], later=[*others, PROBES[1]], after_steps=2, mixed_step_tokens=70)
    assert_probes_equal(got, alone, "beside prompts cut by mixed_step_tokens 70")


def test_the_opt_out_still_serves_the_same_greedy_tokens_alone(tiny_model_dir):
    """--no-batch-invariant: the library's kernels by row count; alone, float32 on the CPU, the
    greedy tokens match the invariant engine's (the arithmetic differs only in summation order)."""
    fast = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=4, max_model_len=256,
                                   kernels=KernelConfig(batch_invariant=False)))
    inv = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=4, max_model_len=256))
    try:
        assert not fast.batch_invariant and inv.batch_invariant
        probe = Admit("g", PROBE_PROMPT, 10, True)
        assert serve(fast, [probe]).tokens["g"] == serve(inv, [probe]).tokens["g"]
    finally:
        fast.close()
        inv.close()
