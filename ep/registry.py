"""The one place that maps an EP backend name to its implementation and maturity. Maturity
`test-only` marks a transport that exists for CPU tests alone (it does not move bytes the way its
production counterpart does): `user_entry`, which every user entry point goes through, refuses it."""
from __future__ import annotations

import dataclasses
import importlib

from pegainfer.ep.backend import ExpertBackend

TEST_ONLY = "test-only"


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
        BackendEntry("local", "production", "pegainfer.ep.backends.local", "LocalBackend",
                     "one rank owns every expert; nothing moves"),
        BackendEntry("host-staged", "production", "pegainfer.ep.backends.host_staged", "HostStagedBackend",
                     "device -> pinned host -> gloo send/recv -> host -> device; CPU, shared GPU or many GPUs"),
        BackendEntry("nccl", "candidate", "pegainfer.ep.backends.nccl", "NcclBackend",
                     "device-resident broadcast + all-to-all on reusable scratch, chunked; one GPU per rank"),
        BackendEntry("nccl-over-gloo-test", TEST_ONLY, "pegainfer.ep.backends.nccl_over_gloo_test", "NcclOverGlooTestBackend",
                     "the nccl backend's code over gloo on CPU, for CPU tests only"),
    )
}


class UnknownBackend(ValueError):
    pass


class TestOnlyBackend(ValueError):
    """A user asked for a transport that exists only for the tests."""


def user_backends() -> list[str]:
    """The backends a user may choose (every one but the test-only ones)."""
    return [n for n, e in REGISTRY.items() if e.maturity != TEST_ONLY]


def entry(name: str) -> BackendEntry:
    if name not in REGISTRY:
        raise UnknownBackend(f"unknown EP backend {name!r} (known: {', '.join(user_backends())})")
    return REGISTRY[name]


def user_entry(name: str) -> BackendEntry:
    """entry(name), refusing a test-only transport: what the CLI, the daemon and the tools call."""
    e = entry(name)
    if e.maturity == TEST_ONLY:
        raise TestOnlyBackend(f"--backend {name} is test-only ({e.summary}); use --backend "
                              f"{' or '.join(user_backends())}")
    return e


def maturity(name: str) -> str:
    return entry(name).maturity

