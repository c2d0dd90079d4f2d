"""Start-up refusals that need nothing loaded: an unknown backend, a test-only transport asked for
by a user, and a runtime the backend cannot work on (nccl without one CUDA GPU per rank). The CLI,
the daemon and the tools call `preflight` before they load weights or bind a port, so a user sees
one line that says what to change; the engine calls it again (allowing test-only transports, which
tests build through the library) before it loads anything."""
from __future__ import annotations

import torch

from pegainfer.ep import registry
from pegainfer.ep.nccl_runtime import NcclRuntimeError

# What preflight raises: each a one-line message for a user (a tool prints it and exits non-zero).
REFUSALS = (registry.UnknownBackend, registry.TestOnlyBackend, NcclRuntimeError)


def preflight(backend: str, device: str, ep_size: int, *, remote_ranks: bool = False,
              allow_test_only: bool = False) -> registry.BackendEntry:
    """Raise UnknownBackend, TestOnlyBackend (unless allow_test_only) or the backend's runtime error
    (NcclRuntimeError). remote_ranks: the expert ranks run elsewhere (`pegainfer expert-worker`),
    so this host runs one rank; else rank 0 spawns all ep_size ranks here."""
    e = registry.entry(backend) if allow_test_only else registry.user_entry(backend)
    check = getattr(e.load(), "check_runtime", None)  # only the backends with expert ranks have one
    try:
        where = torch.device(device)
    except RuntimeError:  # not a device name: start-up reports it where it always has
        return e
    if check is not None:
        check(where, 1 if remote_ranks else ep_size)
    return e
