"""How the ranks of one EP group find each other before any tensor moves: rank 0 hosts a TCPStore
(torch.distributed's standard rendezvous), each expert rank connects, loads its experts and posts a
ready record (or the reason it failed), and rank 0 waits for all of them with a deadline, then posts
its decision (go, or abort with a reason) that every expert rank waits for."""
from __future__ import annotations

import dataclasses
import datetime
import json
import socket
import time
from collections.abc import Callable

import torch.distributed as dist

from pegainfer.ep.backend import RankFailure

DECISION_KEY = "decision"
GO = "go"
ABANDONED_KEY = "abandoned"  # set by rank 0 when it gives up on a failed group: survivors must exit


@dataclasses.dataclass(frozen=True, slots=True)
class ReadyRecord:
    """What an expert rank reports once its experts are loaded."""
    rank: int
    host: str
    pid: int
    device: str
    gpu: str  # the physical GPU (UUID) a CUDA rank runs on; "" on CPU
    experts: str  # "lo..hi"
    bytes: int
    load_s: float

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> ReadyRecord:
        return cls(**json.loads(raw))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def host_store(addr: str, port: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's store server (it does not wait for clients: wait_for_ranks does, with a deadline)."""
    return dist.TCPStore(addr, port, world_size, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def connect_store(addr: str, port: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    """An expert rank's client connection (retries until rank 0's server is up or timeout_s)."""
    return dist.TCPStore(addr, port, world_size, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


def post_ready(store: dist.Store, record: ReadyRecord) -> None:
    store.set(f"ready/{record.rank}", record.encode())


def post_failed(store: dist.Store, rank: int, reason: str) -> None:
    store.set(f"failed/{rank}", reason)


def wait_for_ranks(store: dist.Store, ranks: list[int], timeout_s: float, *,
                   exitcode: Callable[[int], int | None] = lambda rank: None,
                   where: str = "", poll_s: float = 0.05) -> dict[int, ReadyRecord]:
    """Every rank's ready record, or RankFailure naming the ranks that failed, exited, or had not
    posted one by the deadline. exitcode(rank): a locally spawned rank's exit code (None: running)."""
    deadline = time.monotonic() + timeout_s
    ready: dict[int, ReadyRecord] = {}
    while True:
        for r in ranks:
            if r in ready:
                continue
            if store.check([f"failed/{r}"]):
                raise RankFailure(f"expert rank {r} failed to start: {store.get(f'failed/{r}').decode()}")
            if store.check([f"ready/{r}"]):
                ready[r] = ReadyRecord.decode(store.get(f"ready/{r}"))
                continue
            code = exitcode(r)
            if code is not None:
                raise RankFailure(f"expert rank {r} exited with code {code} before it was ready "
                                  f"(its log is above)")
        missing = [r for r in ranks if r not in ready]
        if not missing:
            return ready
        if time.monotonic() >= deadline:
            names = ", ".join(str(r) for r in missing)
            raise RankFailure(f"expert rank(s) {names} did not join within {timeout_s:g} s{where}; "
                              f"ready: {sorted(ready) or 'none'}")
        time.sleep(poll_s)


def decide(store: dist.Store, reason: str | None) -> None:
    """Rank 0's verdict after the ready records: GO, or the reason every expert rank must exit."""
    store.set(DECISION_KEY, GO if reason is None else reason)


def await_decision(store: dist.Store) -> str | None:
    """An expert rank's wait for rank 0's verdict (bounded by the store timeout): None means go."""
    store.wait([DECISION_KEY])
    value = store.get(DECISION_KEY).decode()
    return None if value == GO else value
