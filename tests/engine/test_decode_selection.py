"""One decode function; the KernelConfig selects inside it. The Triton launches of a decode step, read
in Triton's CPU interpreter on a two-layer tiny model (a dense layer, then a MoE layer), follow the
configuration and the row count: the one-launch kernels up to their rows, the router's one-launch
form only with its switch and a backend whose experts read its listing, none at all without
`triton`. tools/benchkit/knobs.py builds these configurations from its flags."""
from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.engine import EngineSpec, build_engine  # noqa: E402
from pegainfer.engine.kernels.config import KernelConfig  # noqa: E402
from pegainfer.engine.model.decode import decode_step  # noqa: E402
from tests.engine.model_builds import count_launches, decode_inputs, rebuild  # noqa: E402

DEFAULT = KernelConfig()


@pytest.fixture(scope="module")
def engine(tiny_variant_dir):
    e = build_engine(EngineSpec(model_dir=str(tiny_variant_dir({"num_hidden_layers": 2})), num_slots=4))
    yield e
    e.close()


class _Gathers(TorchDispatchMode):
    """Counts the embedding gathers torch runs."""

    def __init__(self, seen: collections.Counter):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.embedding.default:
            self.seen["embedding"] += 1
        return func(*args, **(kwargs or {}))


def launches(engine, kernels: KernelConfig, rows: int, monkeypatch, expert_kernel: str = "triton") -> collections.Counter:
    """Kernel name (and "embedding", torch's gather) -> launches of one greedy decode step of `rows` rows."""
    from triton.runtime import interpreter
    model = rebuild(engine, kernels, expert_kernel)
    seen: collections.Counter = collections.Counter()
    run = count_launches(monkeypatch, seen)
    with _Gathers(seen):
        decode_step(model, decode_inputs(list(range(rows))), engine.cache)
    monkeypatch.setattr(interpreter.InterpretedFunction, "run", run)
    return seen


def test_one_row_takes_the_one_launch_kernels(triton_interpreter, engine, monkeypatch):
    n = launches(engine, DEFAULT, 1, monkeypatch)
    assert n["_norm_proj_kernel"] == 2 and n["_proj_norm_kernel"] == 2  # each layer's input, each attention's end
    assert n["_route_small_kernel"] == 1 and "_logits_kernel" not in n  # the MoE layer's router: one launch
    assert n["_head_argmax_kernel"] == 1 and "_argmax_kernel" not in n and "embedding" not in n  # layer 0 reads it
    assert n["_gate_up_kernel"] == 3 and n["_down_kernel"] == 1  # dense + shared SwiGLU in one launch; routed experts
    assert "_swiglu_kernel" not in n and "_rmsnorm_kernel" not in n and n["_moe_rmsnorm_kernel"] == 1  # the final norm


def test_three_rows_take_the_separate_kernels(triton_interpreter, engine, monkeypatch):
    n = launches(engine, DEFAULT, 3, monkeypatch)
    assert "_norm_proj_kernel" not in n and "_proj_norm_kernel" not in n and "_head_argmax_kernel" not in n
    assert n["_rmsnorm_kernel"] == 4 and n["_moe_rmsnorm_kernel"] == 1 and n["_argmax_kernel"] == 1  # 2 per layer
    assert n["embedding"] == 1
    assert n["_route_small_kernel"] == 1 and "_logits_kernel" not in n  # the one-launch router: up to 16 tokens
    assert n["_swiglu_kernel"] == 2 and n["_gate_up_kernel"] == 1  # dense and shared: F.linear + SwiGLU; routed


def test_knobs_move_the_choices(triton_interpreter, engine, monkeypatch):
    n = launches(engine, dataclasses.replace(DEFAULT, router_one_launch=False, embed_in_norm=False, head_argmax_rows=0,
                                             dense_rows=0), 1, monkeypatch)
    assert n["_logits_kernel"] == n["_select_kernel"] == 1 and "_route_small_kernel" not in n
    assert n["_norm_proj_kernel"] == 2 and n["embedding"] == 1  # layer 0's row gathered apart, its norm still inside
    assert n["_argmax_kernel"] == 1 and "_head_argmax_kernel" not in n
    assert n["_swiglu_kernel"] == 2
    n = launches(engine, dataclasses.replace(DEFAULT, argmax_rows=0, mla_output_rows=0, norm_proj_rows=0), 1, monkeypatch)
    assert "_argmax_kernel" not in n and "_proj_norm_kernel" not in n and "_norm_proj_kernel" not in n
    assert n["_rmsnorm_kernel"] == 4 and n["embedding"] == 1  # the norms apart: no row reads the embedding itself
    assert n["_head_argmax_kernel"] == 1  # the head's own rows


def test_a_backend_without_the_listing_gets_the_route_plan(triton_interpreter, engine, monkeypatch):
    n = launches(engine, DEFAULT, 1, monkeypatch, expert_kernel="loop")
    assert n["_logits_kernel"] == n["_select_kernel"] == 1 and "_route_small_kernel" not in n
    assert "_down_kernel" not in n  # the routed experts in the loop, through the plan


def test_no_triton_no_launches(triton_interpreter, engine, monkeypatch):
    for rows in (1, 3):  # the torch forms (and the experts' loop, as off CUDA)
        assert launches(engine, KernelConfig(triton=False), rows, monkeypatch, expert_kernel="loop") == {"embedding": 1}

