"""Batch-invariant mode with the one-row launches on (KernelConfig.norm_linear_rows 1,
engine/kernels/norm_linear.py; opt-in) on the GPU: random weights of the exact Lite shape in bfloat16
with CUDA graphs. A probe request decodes its lone steps through the one-row launches (layer input,
MLA output) and its crowded steps through the dot-product norms and the invariant linear: its tokens
and log-probs are bitwise the same alone and in crowds, greedy and seeded, async scheduling on and off."""
from __future__ import annotations

import pytest
import torch

from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.kernels.config import KernelConfig
from tests.engine.invariance_cases import PROBES, assert_probes_equal, crowd, serve
from tests.engine.invariance_cases import alone as alone_run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


CALLS: dict[str, int] = {"norm_linear": 0, "linear_norm": 0}  # the one-row launches, as the graphs are captured


@pytest.fixture(scope="module")
def engine():
    from pegainfer.engine.kernels import norm_linear as nl
    with pytest.MonkeyPatch.context() as mp:
        for name in CALLS:
            real = getattr(nl, name)
            mp.setattr(nl, name, lambda *a, _real=real, _name=name, **kw: CALLS.update(
                {_name: CALLS[_name] + 1}) or _real(*a, **kw))
        e = build_engine(EngineSpec(random_preset="lite", device="cuda", num_slots=72, max_model_len=1024,
                                    kv_cache_tokens=72 * 1024, kernels=KernelConfig(norm_linear_rows=1)))
        assert e.batch_invariant and e.model.kernels.norm_linear_rows == 1 and e.runner.graphs is not None
        yield e
        e.close()


@pytest.mark.parametrize(("size", "overlap"), [(1, True), (7, False), (63, True)])
def test_a_request_is_the_same_alone_and_in_a_crowd_with_the_one_row_launch(engine, size, overlap):
    alone = alone_run(engine)
    assert CALLS["norm_linear"] > 0 and CALLS["linear_norm"] > 0  # a lone row's graph holds the launches
    others = crowd(size, seed=2000 + size, vocab=engine.cfg.vocab_size)
    admits = [PROBES[0], *others[:size // 2], PROBES[1], *others[size // 2:]]
    assert_probes_equal(serve(engine, admits, overlap=overlap), alone, f"in a crowd of {size} (overlap {overlap})")
