"""The one place that maps an EP backend name to its implementation and maturity."""
from __future__ import annotations

import dataclasses
import importlib

from ep.backend import ExpertBackend


@dataclasses.dataclass(frozen=True, slots=True)
class BackendEntry:
    name: str
    maturity: str  # one of MATURITIES
    module: str
    cls: str
    summary: str

    def load(self) -> type[ExpertBackend]:
        return getattr(importlib.import_module(self.module), self.cls)


REGISTRY: dict[str, BackendEntry] = {
    e.name: e
    for e in (
        BackendEntry("local", "production", "ep.backends.local", "LocalBackend",
                     "one rank owns every expert; nothing moves"),
        BackendEntry("host-staged", "production", "ep.backends.host_staged", "HostStagedBackend",
                     "device -> pinned host -> gloo send/recv -> host -> device; CPU, shared GPU or many GPUs"),
        BackendEntry("nccl", "candidate", "ep.backends.nccl", "NcclBackend",
                     "device-resident broadcast + all-to-all on reusable scratch, chunked; one GPU per rank"),
    )
}


class UnknownBackend(ValueError):
    pass


def entry(name: str) -> BackendEntry:
    if name not in REGISTRY:
        raise UnknownBackend(f"unknown EP backend {name!r} (known: {', '.join(REGISTRY)})")
    return REGISTRY[name]


def maturity(name: str) -> str:
    return entry(name).maturity

