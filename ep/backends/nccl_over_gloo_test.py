"""`nccl-over-gloo-test`: the nccl backend's code (header broadcast, chunked all-to-alls on reusable
scratch) over a gloo process group on CPU, so that CPU tests cover that code path. Test-only: NCCL
moves none of its bytes, so it carries its own name and the maturity `test-only` into every
artifact (start-up log, /v1/models, bench and correctness reports), and user entry points refuse
it (ep/preflight.py). Only tests build engines with it, through the library API."""
from __future__ import annotations

import torch

from pegainfer.ep.backends.nccl import NcclBackend
from pegainfer.ep.nccl_runtime import NcclRuntimeError
from pegainfer.ep.rendezvous import ReadyRecord


class NcclOverGlooTestBackend(NcclBackend):
    name = "nccl-over-gloo-test"
    maturity = "test-only"

    @classmethod
    def pg_backend_for(cls, device: torch.device) -> str:
        return "gloo"

    @classmethod
    def device_of(cls, rank: int, device: torch.device, world_size: int) -> torch.device:
        return device

    @classmethod
    def check_runtime(cls, device: torch.device, ranks_here: int) -> None:
        cls.check_rank_runtime(device)

    @classmethod
    def check_rank_runtime(cls, device: torch.device) -> None:
        if device.type != "cpu":
            raise NcclRuntimeError(f"--backend {cls.name} runs on CPU only (got --device {device}); on GPUs use "
                                   f"--backend nccl (one GPU per rank) or host-staged")

    @classmethod
    def vet(cls, records: list[ReadyRecord], device: torch.device) -> str | None:
        return None
