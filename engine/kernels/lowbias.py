"""engine/counter_rng.py's counter-based uniforms inside Triton kernels, bit for bit: Wellons'
`lowbias32` on uint32 lanes (products wrap mod 2**32, shifts are logical), the stream state of a
row's (64-bit seed, choice index, step), and the uniform of a (state, vocabulary index) pair. The
torch version works in int64 lanes holding 32-bit values; both compute the same bijections, so the
sampler kernel (engine/kernels/sample.py) draws from the same noise as engine.sampler.sample.
tests/engine/kernels/test_sample.py pins the equality on a grid of seeds, negative ones included.

`uniform` launches the hash alone (for that test, and for anyone who wants the noise on the device
without the sampler)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# engine/counter_rng.py's constants (the kernels import nothing from engine/ above them; the test
# above fails if the two drift)
GOLDEN = tl.constexpr(0x9E3779B9)
MUL1 = tl.constexpr(0x7FEB352D)
MUL2 = tl.constexpr(0x846CA68B)
INV_2_23 = tl.constexpr(1.0 / (1 << 23))
MIN_NOISE = tl.constexpr(2.0 ** -25)  # counter_rng.MIN_NOISE


@triton.jit
def mix32(x):
    """lowbias32 of uint32 x."""
    x = x ^ (x >> 16)
    x = x * MUL1
    x = x ^ (x >> 15)
    x = x * MUL2
    return x ^ (x >> 16)


@triton.jit
def stream_state(seed, index, step):
    """The row's uint32 state from int64 seed, choice index and step (counter_rng.stream_state):
    the seed's low and high words, then the index's and the step's low words, each through the hash."""
    lo = seed.to(tl.uint32)  # truncation keeps the low word, negative seeds included
    hi = (seed >> 32).to(tl.uint32)  # an arithmetic shift, then the low word: the high word's bits
    x = mix32(lo + GOLDEN)
    x = mix32(x ^ hi)
    x = mix32(x ^ index.to(tl.uint32))
    return mix32(x ^ step.to(tl.uint32))


@triton.jit
def uniform_at(state, cols):
    """float32 uniforms in (0, 1) of the vocabulary indices cols (int32, >= 0) for one row's state:
    counter_rng.uniform's bits (23 bits + 0.5, exact in float32: 2**-24 .. 1 - 2**-24)."""
    word = mix32(cols.to(tl.uint32) * GOLDEN + 1)
    h = mix32(state ^ word)
    return ((h >> 9).to(tl.float32) + 0.5) * INV_2_23


@triton.jit
def log_noise(state, cols):
    """log(E) with E = -log(U) ~ Exp(1): the exponential race argmax(p / E) is argmax(log p - log E).
    E is at least MIN_NOISE (counter_rng.exponential's floor): an exact log of the largest uniform
    gives 5.96e-8, above it; a log approximated on the device near 1 could give 0, an infinite key."""
    return tl.log(tl.maximum(-tl.log(uniform_at(state, cols)), MIN_NOISE))


@triton.jit
def _uniform_kernel(seed_ptr, index_ptr, step_ptr, out_ptr, V, BLOCK_V: tl.constexpr):
    s = tl.program_id(0)
    c = tl.program_id(1)
    state = stream_state(tl.load(seed_ptr + s), tl.load(index_ptr + s), tl.load(step_ptr + s))
    cols = c * BLOCK_V + tl.arange(0, BLOCK_V)
    ok = cols < V
    tl.store(out_ptr + s.to(tl.int64) * V + cols, uniform_at(state, cols), mask=ok)


def uniform(seed: torch.Tensor, index: torch.Tensor, step: torch.Tensor, vocab: int) -> torch.Tensor:
    """[S, vocab] float32: counter_rng.uniform(counter_rng.stream_state(seed, index, step), vocab),
    computed by the Triton hash. seed, index, step: [S] int64 on one device."""
    rows = seed.shape[0]
    out = torch.empty(rows, vocab, dtype=torch.float32, device=seed.device)
    block = min(1024, triton.next_power_of_2(vocab))
    _uniform_kernel[(rows, triton.cdiv(vocab, block))](seed, index, step, out, vocab, BLOCK_V=block)
    return out
