"""Rank 0 brings up an EP group: host the rendezvous store, spawn the expert ranks on this host (or
wait for `pegainfer expert-worker` ranks started elsewhere), wait for every rank with a deadline,
vet what they report, then build the process group and start watching the ranks' heartbeats.
Everything it knows of the model comes in the EPSpec (ep/spec.py), including the engine's function
that loads a spawned rank's experts."""
from __future__ import annotations

import dataclasses
import logging
import pickle
import sys
from collections.abc import Callable

import torch
import torch.multiprocessing as mp

from pegainfer.ep.group import RankGroup, make_process_group
from pegainfer.ep.heartbeat import RankWatch
from pegainfer.ep.log import log_event
from pegainfer.ep.rendezvous import ReadyRecord, decide, free_port, host_store, wait_for_ranks
from pegainfer.ep.spec import EPSpec
from pegainfer.ep.worker import WorkerSpec, spawned_main

DEFAULT_JOIN_TIMEOUT_S = 300.0  # loading a rank's experts of a real checkpoint takes a while


@dataclasses.dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Where the group meets and who starts the expert ranks. spawn: rank 0 starts ranks 1..N-1 on
    this host (127.0.0.1, a free port); otherwise they are started elsewhere and join addr:port."""
    world_size: int
    backend: str
    pg_backend: str
    addr: str
    port: int
    spawn: bool
    rank_timeout_s: float
    join_timeout_s: float

    @classmethod
    def from_spec(cls, spec: EPSpec, world_size: int, pg_backend: str) -> LaunchPlan:
        # Without a master address rank 0 spawns every rank itself, on this host and a free port.
        return cls(world_size, spec.backend, pg_backend, spec.master_addr or "127.0.0.1",
                   spec.master_port or free_port(), spec.spawn, spec.rank_timeout_s,
                   spec.join_timeout_s or DEFAULT_JOIN_TIMEOUT_S)


def launch_group(spec: EPSpec, plan: LaunchPlan, device_of: Callable[[int], torch.device],
                 vet: Callable[[list[ReadyRecord]], str | None] = lambda records: None) -> RankGroup:
    """Rank 0's side of start-up. device_of(rank): the device a spawned rank runs on; vet: a reason
    to refuse the ranks as they reported themselves (None: accept). Raises RankFailure naming the
    ranks that failed or never joined; every spawned rank is stopped on any failure."""
    store = host_store(plan.addr, plan.port, plan.world_size, plan.join_timeout_s)
    procs = {}
    decided = False
    try:
        if plan.spawn:
            procs = _spawn(spec, plan, device_of)
        where = "" if plan.spawn else (f" (start them with: pegainfer expert-worker --rank R --world-size "
                                       f"{plan.world_size} --master-addr {plan.addr} --master-port {plan.port} "
                                       f"--backend {plan.backend})")
        records = wait_for_ranks(store, list(range(1, plan.world_size)), plan.join_timeout_s,
                                 exitcode=lambda r: procs[r].exitcode if r in procs else None, where=where)
        for rec in records.values():
            log_event("expert_rank_joined", **dataclasses.asdict(rec), backend=plan.backend)
        reason = vet(list(records.values()))
        decide(store, reason)
        decided = True
        if reason is not None:
            raise EPStartError(reason)
        pg = make_process_group(store, 0, plan.world_size, plan.pg_backend, plan.rank_timeout_s)
        watch = RankWatch.start(store, plan.world_size, plan.rank_timeout_s)  # every rank builds it next
    except BaseException as e:
        if not decided:
            decide(store, f"rank 0 gave up: {e}")
        RankGroup(0, plan.world_size, store, None, plan.pg_backend, plan.rank_timeout_s, procs=procs).close()
        raise
    return RankGroup(0, plan.world_size, store, pg, plan.pg_backend, plan.rank_timeout_s, procs=procs, watch=watch)


class EPStartError(RuntimeError):
    """Rank 0 refused the group the expert ranks formed (the message says what to change)."""


def _stderr_formatter() -> logging.Formatter | None:
    """The formatter of rank 0's root handler on stderr (the daemon's JSON lines): the ranks it
    spawns share that stderr and write their lines the same way. None when there is none, or when
    it cannot travel to a spawned process."""
    for handler in logging.getLogger().handlers:
        if getattr(handler, "stream", None) is sys.stderr and handler.formatter is not None:
            try:
                pickle.dumps(handler.formatter)
            except Exception:  # noqa: BLE001 - any formatter that does not pickle stays behind
                return None
            return handler.formatter
    return None


def _spawn(spec: EPSpec, plan: LaunchPlan, device_of: Callable[[int], torch.device]) -> dict:
    if spec.loader is None:
        raise ValueError("spawning expert ranks needs the engine's expert loader (EPSpec.loader)")
    ctx = mp.get_context("spawn")
    level = logging.getLogger("pegainfer").getEffectiveLevel()
    formatter = _stderr_formatter()
    procs = {}
    for r in range(1, plan.world_size):
        ws = WorkerSpec(rank=r, world_size=plan.world_size, master_addr=plan.addr, master_port=plan.port,
                        backend=plan.backend, loader=spec.loader, source=spec.source, device=str(device_of(r)),
                        dtype=spec.dtype, num_threads=torch.get_num_threads(), join_timeout_s=plan.join_timeout_s,
                        log_level=level, log_formatter=formatter)
        p = ctx.Process(target=spawned_main, args=(ws,), name=f"pegainfer-expert-rank-{r}", daemon=True)
        p.start()
        procs[r] = p
    return procs
