"""Start-up checks that keep the nccl backend from running where NCCL cannot or is known to fail: a
CUDA GPU for every rank (a CPU device, no CUDA, or fewer visible GPUs than ranks is refused, naming
host-staged as the way out), no GPU shared by two ranks, and a minimum NCCL runtime per GPU
architecture. Each failure says what to change."""
from __future__ import annotations

import torch
import torch.distributed as dist

from pegainfer.ep.rendezvous import ReadyRecord

# Oldest NCCL runtime that supports each compute capability (older ones fail at communicator init or
# hang). sm_100: NCCL 2.25.1 release notes, "Add Blackwell/SM100 support"; sm_120 (RTX 50xx /
# RTX PRO Blackwell): 2.26.2.
NCCL_FLOORS: dict[tuple[int, int], tuple[int, int, int]] = {
    (10, 0): (2, 25, 1),
    (12, 0): (2, 26, 2),
}


class NcclRuntimeError(RuntimeError):
    """The nccl backend cannot run on this machine as configured; the message says what to change."""


def _fmt(v: tuple) -> str:
    return ".".join(str(x) for x in v)


def check_placement(ranks: int, first_index: int, device_count: int) -> None:
    """The ranks of this host run on GPUs first_index, first_index + 1, ...: all of them must exist."""
    if first_index + ranks > device_count:
        raise NcclRuntimeError(
            f"the nccl backend needs one GPU per rank: {ranks} rank(s) on this host starting at cuda:{first_index} "
            f"need {first_index + ranks} visible GPUs, found {device_count}. Use --ep-size <= "
            f"{max(device_count - first_index, 1)}, make more GPUs visible (CUDA_VISIBLE_DEVICES), or use "
            f"--backend host-staged (several ranks may share a GPU there)")


def check_version(version: tuple, capabilities: dict[str, tuple[int, int]]) -> None:
    """version: the NCCL runtime actually loaded; capabilities: device name -> (major, minor)."""
    for device, cap in sorted(capabilities.items()):
        floor = NCCL_FLOORS.get(tuple(cap))
        if floor is not None and tuple(version[:3]) < floor:
            raise NcclRuntimeError(
                f"NCCL {_fmt(version)} is loaded, but {device} (sm_{cap[0]}{cap[1]}) needs NCCL >= {_fmt(floor)}. "
                f"Point the loader at a newer libnccl.so.2 (for example pip install 'nvidia-nccl-cu12>="
                f"{_fmt(floor)}' and put its nvidia/nccl/lib first in LD_LIBRARY_PATH, or LD_PRELOAD it), "
                f"or use --backend host-staged")


def check_distinct_gpus(records: list[ReadyRecord], rank0_gpu: str) -> str | None:
    """The reason to refuse the group when two ranks sit on one physical GPU (NCCL rejects that with
    'Duplicate GPU detected'), else None."""
    seen: dict[str, int] = {rank0_gpu: 0} if rank0_gpu else {}
    for rec in sorted(records, key=lambda r: r.rank):
        if not rec.gpu:
            continue
        if rec.gpu in seen:
            return (f"ranks {seen[rec.gpu]} and {rec.rank} both run on GPU {rec.gpu} ({rec.device} on {rec.host}); "
                    f"NCCL refuses two ranks on one GPU ('Duplicate GPU detected'): give every rank its own GPU "
                    f"(CUDA_VISIBLE_DEVICES / --device cuda:N per expert-worker) or use --backend host-staged")
        seen[rec.gpu] = rec.rank
    return None


def check_nccl_runtime(device: torch.device, ranks_here: int) -> None:
    """All checks rank 0 (or an expert-worker) can make before NCCL is touched. ranks_here: how many
    ranks this host runs from `device` on (the whole group when rank 0 spawns them, else 1)."""
    if device.type != "cuda":
        raise NcclRuntimeError(f"--backend nccl needs one CUDA GPU per rank, but --device {device} is not a GPU; "
                               f"use --backend host-staged (it runs on CPU, and lets ranks share a GPU)")
    if not torch.cuda.is_available():
        raise NcclRuntimeError(f"--backend nccl needs one CUDA GPU per rank, but --device {device} was given and "
                               f"CUDA is not available (no GPU visible); use --backend host-staged --device cpu")
    if not dist.is_nccl_available():
        raise NcclRuntimeError("this torch build has no NCCL; use --backend host-staged")
    first = device.index or 0
    check_placement(ranks_here, first, torch.cuda.device_count())
    caps = {f"cuda:{i}": torch.cuda.get_device_capability(i) for i in range(first, first + ranks_here)}
    check_version(torch.cuda.nccl.version(), caps)
