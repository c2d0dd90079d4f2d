"""KV slots are sized from free memory, capped by --max-active, and a context that cannot fit once
is a clear error."""
from __future__ import annotations

import pytest
import torch

from pegainfer.engine.kv_capacity import CPU_DEFAULT_SLOTS, MAX_AUTO_SLOTS, RESERVE_BYTES, CapacityError, kv_slots, slots_that_fit

LITE_BYTES_PER_TOKEN = 27 * 576 * 2  # layers x (512 latent + 64 rope) x bf16


def test_lite_on_an_h200_after_weights():
    free = 100 << 30  # ≈141 GB card minus ≈31 GB of weights and the CUDA context
    slots = slots_that_fit(free, 4096, LITE_BYTES_PER_TOKEN, cap=None)
    assert slots == MAX_AUTO_SLOTS  # 256 x 4096 tokens x 31 KB ≈ 32 GB fits
    assert slots_that_fit(free, 163840, LITE_BYTES_PER_TOKEN, cap=None) == 16  # full 160K context: few slots


def test_cap_and_the_bound():
    assert slots_that_fit(100 << 30, 4096, LITE_BYTES_PER_TOKEN, cap=16) == 16
    free = RESERVE_BYTES * 2
    fit = slots_that_fit(free, 4096, LITE_BYTES_PER_TOKEN, cap=None)
    assert (fit + 1) * 4096 * LITE_BYTES_PER_TOKEN <= free * 0.9 - RESERVE_BYTES


def test_nothing_fits_is_a_clear_error():
    with pytest.raises(CapacityError, match="--max-model-len"):
        slots_that_fit(RESERVE_BYTES, 4096, LITE_BYTES_PER_TOKEN, cap=None)


def test_cpu_default():
    assert kv_slots(torch.device("cpu"), 4096, 100, cap=None) == (CPU_DEFAULT_SLOTS, None)
    assert kv_slots(torch.device("cpu"), 4096, 100, cap=3) == (3, None)
