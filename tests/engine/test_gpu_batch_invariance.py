"""Batch invariance on the GPU (one CUDA device; skipped without one): random weights of the exact
Lite shape in bfloat16 with the Triton kernels and CUDA graphs, as the daemon serves them. A probe
request's tokens and log-probs are bitwise the same alone and inside crowds up to 256 rows (255
others of mixed lengths), with its prompt packed or chunked, greedy and seeded, async scheduling on
and off; and the decode step's greedy tokens for one row do not change with the rows beside it."""
from __future__ import annotations

import pytest
import torch

from pegainfer.engine.engine import EngineSpec, build_engine
from tests.engine.invariance_cases import PROBES, Seen, assert_probes_equal, crowd, serve
from tests.engine.invariance_cases import alone as alone_run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def engine():
    e = build_engine(EngineSpec(random_preset="lite", device="cuda", num_slots=260, max_model_len=1024,
                                kv_cache_tokens=260 * 1024))  # not most of the free memory
    assert e.batch_invariant and e.model.kernels.triton and e.runner.graphs is not None
    yield e
    e.close()


@pytest.fixture(scope="module")
def alone(engine) -> Seen:
    return alone_run(engine)


@pytest.mark.parametrize(("size", "overlap", "max_prefill"), [
    (1, True, 8192), (7, False, 8192), (63, True, 8192), (127, True, 512), (254, True, 8192), (254, False, 97),
])
def test_a_request_is_the_same_alone_and_in_a_crowd_on_the_gpu(engine, alone, size, overlap, max_prefill):
    others = crowd(size, seed=1000 + size, vocab=engine.cfg.vocab_size)
    admits = [PROBES[0], *others[:size // 2], PROBES[1], *others[size // 2:]]
    got = serve(engine, admits, overlap=overlap, max_prefill_tokens=max_prefill)
    assert_probes_equal(got, alone, f"in a crowd of {size} (overlap {overlap}, max_prefill_tokens {max_prefill})")


@pytest.mark.parametrize("max_prefill", [1, 5, 16])
def test_a_prompt_cut_into_chunks_gives_the_same_request_on_the_gpu(engine, alone, max_prefill):
    assert_probes_equal(serve(engine, list(PROBES), max_prefill_tokens=max_prefill), alone,
                        f"chunked by max_prefill_tokens {max_prefill}")


def test_joining_rows_that_decode_gives_the_same_request_on_the_gpu(engine, alone):
    got = serve(engine, crowd(100, seed=7, vocab=engine.cfg.vocab_size), later=list(PROBES), after_steps=4)
    assert_probes_equal(got, alone, "joining 100 rows that decode")
