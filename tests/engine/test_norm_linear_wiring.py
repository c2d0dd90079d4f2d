"""The decode step with batch-invariant mode's one-row launches on (KernelConfig.norm_linear_rows 1,
engine/kernels/norm_linear.py), on the CPU in Triton's interpreter (a 2-layer tiny model, float32,
its projections through the invariant Triton linear as on CUDA): a lone row takes the fused layer
input and MLA output launches (layer 0 reading its embedding row itself, or not), a crowd takes the
dot-product norms beside the linear, and the lone row's final hidden state is bit for bit its row
in the crowd."""
from __future__ import annotations

import collections
import dataclasses

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.engine import EngineSpec, build_engine  # noqa: E402
from pegainfer.engine.kernels.config import KernelConfig  # noqa: E402
from pegainfer.engine.model import attention as attention_module  # noqa: E402
from pegainfer.engine.model.decode import decode_hidden  # noqa: E402
from tests.engine.model_builds import count_launches, decode_inputs, rebuild  # noqa: E402

# the invariant configuration as on_device resolves it on CUDA (the other one-row kernels off)
ON = dataclasses.replace(KernelConfig(norm_linear_rows=1), norm_proj_rows=0, mla_output_rows=0, dense_rows=0,
                         head_argmax_rows=0)


@pytest.fixture(scope="module")
def engine(tiny_variant_dir):
    e = build_engine(EngineSpec(model_dir=str(tiny_variant_dir({"num_hidden_layers": 2})), num_slots=4))
    yield e
    e.close()


@pytest.fixture
def launches(triton_interpreter, monkeypatch) -> collections.Counter:
    """Triton launches by kernel name; attention's projections through the invariant Triton linear
    (on the CPU `linear` takes its torch form, whose order the fused launches do not follow)."""
    from pegainfer.engine.kernels.linear import triton_linear
    real = attention_module.linear
    monkeypatch.setattr(attention_module, "linear", lambda x, w, k, out_dtype=None: triton_linear(x, w, k.linear)
                        if x.dim() == 2 and out_dtype is None else real(x, w, k, out_dtype))
    seen: collections.Counter = collections.Counter()
    count_launches(monkeypatch, seen)
    return seen


def _hidden(model, engine, rows: list[int]) -> torch.Tensor:
    return decode_hidden(model, decode_inputs(rows), engine.cache).clone()


@pytest.mark.parametrize("kernels", [ON, dataclasses.replace(ON, embed_in_norm=False, norm_linear_n=32)],
                         ids=["embedding-in-launch", "embedding-apart"])
def test_a_lone_row_takes_the_one_row_launches_and_keeps_the_crowds_bits(engine, launches, kernels):
    model = rebuild(engine, kernels, "triton")
    crowd = _hidden(model, engine, [0, 1, 2])
    assert launches["_dot_norm_kernel"] == 4 and "_norm_linear_kernel" not in launches  # 2 layers x 2 norms
    for r in (0, 1, 2):
        launches.clear()
        alone = _hidden(model, engine, [r])
        assert launches["_norm_linear_kernel"] == 2 and launches["_linear_norm_kernel"] == 2, dict(launches)
        assert launches["_dot_norm_kernel"] == 0 and launches["_linear_kernel"] == 0, dict(launches)
        assert torch.equal(alone[0], crowd[r]), (kernels.embed_in_norm, r)


def test_off_takes_neither(engine, launches):
    model = rebuild(engine, dataclasses.replace(ON, norm_linear_rows=0), "triton")
    _hidden(model, engine, [0])
    assert not {"_norm_linear_kernel", "_linear_norm_kernel", "_dot_norm_kernel"} & set(launches)
