"""engine/kernels/precompile.py: the device sampler's launches recorded instead of run (the warm
list threaded through sample.sample and sample_split.launch) are exactly the launches a real call
makes: replayed one by one they give the real call's bits, and nothing runs while recording;
compile_all compiles each recorded launch once, in threads, and reports a failure instead of
raising it; DeviceSampler records both graph kinds' launches and does nothing off CUDA. On a GPU:
after DeviceSampler.precompile, a real choose compiles nothing more (the specialisations match)."""
from __future__ import annotations

import threading

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.kernels.config import SampleTiling  # noqa: E402
from pegainfer.engine.kernels.precompile import Launch, compile_all  # noqa: E402
from pegainfer.engine.kernels.sample_rows import SampleOut  # noqa: E402
from tests.engine.kernels.sample_cases import mixed_draws  # noqa: E402
from tests.engine.kernels.test_sample import quick_interpreter, run  # noqa: E402, F401
from tests.engine.kernels.test_sample_split import assert_same_bits  # noqa: E402

SPLIT = ["_first_kernel", "_count_kernel", "_plan_kernel", "_count_kernel", "_plan_kernel", "_gather_kernel",
         "_round_kernel", "_whole_kernel"]


def sentinel_out(s: int, n_top: int) -> SampleOut:
    return SampleOut(torch.full((s,), -7, dtype=torch.int64), torch.full((s,), -7.0),
                     torch.full((s, n_top), -7, dtype=torch.int64), torch.full((s, n_top), -7.0))


@pytest.mark.parametrize("chunks", [3, 0], ids=["split", "one_program"])
def test_recorded_launches_are_the_real_ones(triton_interpreter, chunks):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 300, generator=gen) * 3
    draws = mixed_draws(5, 300, seed=4)
    kw = dict(block_v=64, cap=64, chunks=chunks)
    warm: list[Launch] = []
    out = run(logits, draws, 5, warm=warm, out=sentinel_out(5, 5), **kw)
    assert [ln.kernel.fn.__name__ for ln in warm] == (SPLIT if chunks else ["_sample_kernel"])
    assert all((t == -7).all() for t in out), "recording ran a kernel"
    for ln in warm:  # the recorded arguments, launched as recorded
        ln.kernel[ln.grid](*ln.args, **ln.kwargs)
    assert_same_bits(out, run(logits, draws, 5, **kw))


def test_the_device_sampler_records_both_graph_kinds_and_skips_off_cuda(triton_interpreter):
    from pegainfer.engine.device_sampler import DeviceSampler
    ds = DeviceSampler(3, 300, 4, torch.device("cpu"), kernel=True, tiling=SampleTiling(chunks=3, block_v=64))
    warm: list[Launch] = []
    for lp in (False, True):
        ds.choose(torch.zeros(2, 300), torch.zeros(2, dtype=torch.int64), lp, warm=warm)
    assert [ln.kernel.fn.__name__ for ln in warm] == SPLIT * 2
    assert {ln.kwargs["LOGPROBS"] for ln in warm if "LOGPROBS" in ln.kwargs} == {False, True}
    assert ds.precompile(torch.float32, threads=4) == (0, 0.0, [])  # nothing to compile off CUDA


class FakeKernel:
    def __init__(self, name: str, fail: bool = False):
        self.__name__, self.fail, self.calls, self.threads = name, fail, [], set()

    def warmup(self, *args, grid, **kwargs):
        self.threads.add(threading.get_ident())
        self.calls.append((args, grid, kwargs))
        if self.fail:
            raise RuntimeError("ptxas said no")


def test_compile_all_compiles_each_launch_in_threads_and_reports_failures():
    ok, bad = FakeKernel("ok"), FakeKernel("bad", fail=True)
    launches = [Launch(ok, (i, 2), (i, "x"), {"BLOCK": i}) for i in range(6)] + [Launch(bad, (1,), (), {})]
    seconds, errors = compile_all(launches, torch.device("cpu"), threads=3)
    assert sorted(ok.calls) == sorted(((i, "x"), (i, 2), {"BLOCK": i}) for i in range(6))
    assert errors == ["bad: RuntimeError: ptxas said no"] and seconds >= 0
    assert threading.get_ident() not in ok.threads  # the pool's threads, not the caller's
    assert compile_all([], torch.device("cpu"), threads=3)[1] == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_after_precompile_a_real_choose_compiles_nothing(triton_gpu):
    from pegainfer.engine.device_sampler import DeviceSampler
    from pegainfer.engine.kernels import sample, sample_split
    kernels = [sample._sample_kernel] + [getattr(sample_split, n) for n in dict.fromkeys(SPLIT)]

    def compiled() -> int:
        return sum(len(c[0]) for k in kernels for c in k.device_caches.values())

    dev = torch.device("cuda", torch.cuda.current_device())
    # a vocabulary and tiling no other test compiled: every launch is a new specialisation
    ds = DeviceSampler(4, 3000, 8, dev, kernel=True, tiling=SampleTiling(chunks=5, block_v=256))
    before = compiled()
    n, seconds, errors = ds.precompile(torch.bfloat16, threads=8)
    assert (n, errors) == (16, []) and compiled() == before + 16
    ds.pad(0, 0, 8)
    ds.params.copy_(ds.host[0])
    for lp in (False, True):
        tokens = torch.empty(8, dtype=torch.int64, device=dev)
        ds.choose(torch.randn(8, 3000, device=dev, dtype=torch.bfloat16), tokens, lp)
        torch.cuda.synchronize()
        assert tokens.min() >= 0
    assert compiled() == before + 16, "a real launch compiled a specialisation precompile missed"
