"""What ep/ is told at start-up, as plain frozen data: the EP group's settings (EPSpec), the few
model facts the transports size their buffers by (MoEShape), where the weights come from
(WeightSource), and the signature of the engine-side function that loads one expert rank's experts
(ExpertLoader). engine/ builds these from its own spec and config and passes them down, so ep/
never imports the engine's configuration, weights or presets (the kernel configuration, a torch-free
leaf of engine/kernels, is the one engine type it carries). Torch-free."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

from pegainfer.engine.kernels.config import KernelConfig

if TYPE_CHECKING:  # annotations only: this module stays importable without torch
    import torch

    from pegainfer.ep.experts import ExpertShard

DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True, slots=True)
class MoEShape:
    """The model facts ep/ needs (field names as in the checkpoint's config.json)."""
    n_routed_experts: int
    moe_layers: tuple[int, ...]
    hidden_size: int
    moe_intermediate_size: int


@dataclasses.dataclass(frozen=True, slots=True)
class WeightSource:
    """Where every rank reads its weights: a checkpoint folder, or a random preset and its seed."""
    model_dir: str | None = None
    random_preset: str | None = None
    seed: int = 0


class ExpertLoader(Protocol):
    """Loads exactly the experts `rank` owns in a group of `world_size` ranks, and the model facts.
    Implemented by the engine (engine/ep_setup.py) and passed in: a module-level function, so that
    multiprocessing's spawn pickles it by its qualified name into the ranks rank 0 starts."""

    def __call__(self, source: WeightSource, rank: int, world_size: int, device: torch.device,
                 dtype: torch.dtype) -> tuple[MoEShape, ExpertShard]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class EPSpec:
    """Rank 0's EP settings. master_addr None: rank 0 spawns the expert ranks on this host; set:
    ranks started elsewhere (`pegainfer expert-worker`) join master_addr:master_port."""
    backend: str = "local"
    ep_size: int = 1
    device: str = "cpu"
    dtype: str = "float32"  # resolved: one of DTYPES
    rank_timeout_s: float = 10.0  # a silent expert rank fails the group after this long
    join_timeout_s: float | None = None  # how long rank 0 waits for ranks to load (None: ep.launch's default)
    master_addr: str | None = None
    master_port: int | None = None
    chunk_bytes: int | None = None  # nccl: the largest single collective (None: environment or default)
    kernels: KernelConfig = KernelConfig()  # the expert kernels' switch and tilings (engine/kernels/config.py)
    source: WeightSource = WeightSource()
    loader: ExpertLoader | None = None  # how the ranks rank 0 spawns load their experts

    @property
    def spawn(self) -> bool:
        return self.master_addr is None


def resolve_dtype(name: str | None, device: str) -> str:
    """The dtype's name: as given, else bfloat16 on CUDA and float32 elsewhere."""
    name = name or ("bfloat16" if device.startswith("cuda") else "float32")
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r} (float32 or bfloat16)")
    return name
