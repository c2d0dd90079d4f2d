"""The counter-based random numbers the sampler draws from: a uniform number for every (stream,
step, vocabulary entry), computed by hashing those integers on the device, with no generator state.

A sequence's draws therefore depend only on its own seed, its choice index and how many tokens it
has generated, never on which other rows share the batch, how the batch is ordered or whether the
step ran as a graph: the same seed gives the same tokens alone or inside any batch (Philox-style
counters, as JAX's and cuRAND's counter generators, here from a small integer hash so that CPU and
GPU compute the identical bits).

The hash is Wellons' `lowbias32` (a bijection on 32-bit integers with good avalanche), applied in
int64 lanes that hold 32-bit values: every product stays below 2**63, so nothing relies on signed
overflow wrapping, and the result is exact on any device.
"""
from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9  # 2**32 / golden ratio: separates the words fed to the hash
MIN_NOISE = 2.0 ** -25  # the exponential noise's floor: a noise of 0 would give its column an infinite weight


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32), split in 16-bit halves so no int64 product overflows."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def stream_state(seed: torch.Tensor, index: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """One 32-bit state per row from its 64-bit seed, choice index and step: all [S] int64."""
    lo = seed & MASK32
    hi = (seed >> 32) & MASK32  # an arithmetic shift of a negative seed still yields 32 clean bits
    x = mix32((lo + _GOLDEN) & MASK32)
    x = mix32(x ^ hi)
    x = mix32(x ^ (index & MASK32))
    return mix32(x ^ (step & MASK32))  # [S]


def uniform(state: torch.Tensor, vocab: int) -> torch.Tensor:
    """[S, vocab] float32 uniforms in (0, 1), one per (row state, vocabulary index)."""
    v = torch.arange(vocab, dtype=torch.int64, device=state.device)
    word = mix32((v * _GOLDEN + 1) & MASK32)  # [V]
    return to_unit(mix32(state[:, None] ^ word[None, :]))  # [S, V]


def to_unit(h: torch.Tensor) -> torch.Tensor:
    """32-bit hashes (int64 lanes) -> float32 in (0, 1): the top 23 bits + 0.5, times 2**-23, exact in
    float32, so 2**-24 <= u <= 1 - 2**-24. (24 bits + 0.5 would not be: 2**24 - 0.5 rounds to 2**24,
    a uniform of exactly 1, an Exp(1) noise of 0, and the race's winner would be that column whatever
    its probability, 102,400 x 2**-24 = 0.6 % of a row's draws at lite's vocabulary.)"""
    return ((h >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def exponential(seed: torch.Tensor, index: torch.Tensor, step: torch.Tensor, vocab: int) -> torch.Tensor:
    """[S, vocab] Exp(1) noise: argmax(probs / noise) draws a token with probability probs / sum(probs).
    Never below MIN_NOISE (never reached with an exact log: the largest uniform gives 5.96e-8)."""
    return (-torch.log(uniform(stream_state(seed, index, step), vocab))).clamp_min(MIN_NOISE)
