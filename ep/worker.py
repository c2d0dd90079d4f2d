"""An expert-only rank: connect to rank 0's rendezvous, load only the experts this rank owns, report
ready, then serve the backend's per-layer exchange until rank 0 says stop (or goes away).

`run_expert_worker` is what `pegainfer expert-worker` calls on another host; rank 0 spawns the same
code on its own host through `spawned_main`. Which tensors a rank loads, and the model facts, come
from the engine's ExpertLoader (ep/spec.py) that the caller passes in: ep/ reads no checkpoint."""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import threading
import time
from typing import NoReturn

import torch
import torch.distributed as dist

from pegainfer.ep import registry
from pegainfer.ep.experts import ExpertShard
from pegainfer.ep.group import RankGroup, make_process_group
from pegainfer.ep.heartbeat import beat_until_lost, make_liveness_group
from pegainfer.ep.log import log_event
from pegainfer.ep.rendezvous import (
    ReadyRecord,
    await_decision,
    connect_store,
    post_failed,
    post_ready,
)
from pegainfer.ep.spec import ExpertLoader, MoEShape, WeightSource, resolve_dtype

SERVE_TIMEOUT_S = 7 * 24 * 3600.0  # an expert rank idles as long as rank 0 does: only rank 0 times out


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerSpec:
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    backend: str
    loader: ExpertLoader  # the engine's: loads this rank's experts and says the model's MoE shape
    source: WeightSource = WeightSource()
    device: str = "cpu"
    dtype: str | None = None  # default as rank 0's: float32 on CPU, bfloat16 on CUDA
    num_threads: int | None = None  # CPU GEMM threads; rank 0 passes its own so the bits match
    join_timeout_s: float = 300.0
    log_level: int | None = None  # set by rank 0 for the ranks it spawns (they inherit its stderr)
    log_formatter: logging.Formatter | None = None  # rank 0's (JSON lines), for the same reason


def run_expert_worker(rank: int, world_size: int, master_addr: str, master_port: int, *, loader: ExpertLoader,
                      model_dir: str | None = None, random_preset: str | None = None, seed: int = 0,
                      backend: str = "host-staged", device: str = "cpu", dtype: str | None = None,
                      join_timeout_s: float = 300.0, num_threads: int | None = None) -> int:
    """Run expert rank `rank` of a `world_size` EP group whose rank 0 listens at master_addr:master_port,
    loading its experts with `loader` (the CLI passes the engine's). Returns the process exit code:
    0 after rank 0's stop message, 1 when start-up or the group failed."""
    return serve(WorkerSpec(rank, world_size, master_addr, master_port, backend, loader,
                            WeightSource(model_dir, random_preset, seed), device=device, dtype=dtype,
                            num_threads=num_threads, join_timeout_s=join_timeout_s))


def spawned_main(spec: WorkerSpec) -> None:
    """torch.multiprocessing entry point for the ranks rank 0 starts on its own host."""
    if spec.log_level is not None:
        logging.basicConfig(level=spec.log_level, stream=sys.stderr, format="%(message)s")
        if spec.log_formatter is not None:
            logging.getLogger().handlers[0].setFormatter(spec.log_formatter)
    end_process(serve(spec))


def end_process(code: int) -> NoReturn:
    """Exit an expert rank's process once serve() returned, skipping interpreter teardown: it takes
    seconds with torch loaded, and the heartbeat thread may still sit in a gloo call, which aborts
    the process (std::terminate) while the interpreter finalizes. Nothing is left to clean up."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve(spec: WorkerSpec) -> int:
    if not 0 < spec.rank < spec.world_size:
        raise ValueError(f"expert rank must be in 1..{spec.world_size - 1}, got {spec.rank}")
    if spec.num_threads:
        torch.set_num_threads(spec.num_threads)
    store = connect_store(spec.master_addr, spec.master_port, spec.world_size, spec.join_timeout_s)
    try:
        cls = registry.entry(spec.backend).load()
        if not hasattr(cls, "serve"):
            raise ValueError(f"backend {spec.backend!r} runs no expert ranks (use host-staged or nccl)")
        device = _rank_device(spec.device)
        cls.check_rank_runtime(device)
        dtype = getattr(torch, resolve_dtype(spec.dtype, str(device)))
        cfg, shard, record = load_shard(spec, device, dtype)
    except Exception as e:  # noqa: BLE001 - any start-up error goes to rank 0, which names it and this rank
        post_failed(store, spec.rank, f"{type(e).__name__}: {e}")
        log_event("expert_rank_failed", rank=spec.rank, error=f"{type(e).__name__}: {e}")
        return 1
    post_ready(store, record)
    log_event("expert_rank_ready", **dataclasses.asdict(record), backend=spec.backend)
    verdict = await_decision(store)
    if verdict is not None:
        log_event("expert_rank_aborted", rank=spec.rank, reason=verdict)
        return 1
    pg_backend = cls.pg_backend_for(device)
    stopped = threading.Event()
    try:
        pg = make_process_group(store, spec.rank, spec.world_size, pg_backend, SERVE_TIMEOUT_S)
        _beat_until_rank0_is_gone(spec, make_liveness_group(store, spec.rank, spec.world_size, SERVE_TIMEOUT_S),
                                  stopped)
        group = RankGroup(spec.rank, spec.world_size, store, pg, pg_backend, SERVE_TIMEOUT_S)
        with torch.inference_mode():
            cls.serve(group, shard, cfg, device, dtype)
        stopped.set()  # from here rank 0 may go away at any moment: that is no longer a loss
    except RuntimeError as e:  # rank 0 went away or a collective failed: nothing left to serve
        log_event("expert_rank_lost", rank=spec.rank, error=str(e).splitlines()[0][:200])
        return 1
    log_event("expert_rank_stopped", rank=spec.rank)
    return 0


def _beat_until_rank0_is_gone(spec: WorkerSpec, live: dist.ProcessGroup, stopped: threading.Event) -> None:
    """Beat to rank 0 (ep/heartbeat.py) on a thread of its own, and end this process when rank 0 is
    gone or abandoned the failed group: a rank blocked in an NCCL kernel would otherwise wait on the
    GPU for good. Its own store connection, so the serving thread's use of the store is untouched."""
    store = connect_store(spec.master_addr, spec.master_port, spec.world_size, 10.0)

    def beat() -> None:
        reason = beat_until_lost(live, store, stopped)
        if reason is None:
            return
        log_event("expert_rank_orphaned", rank=spec.rank, reason=reason)
        logging.shutdown()
        os._exit(1)

    threading.Thread(target=beat, name=f"pegainfer-heartbeat-{spec.rank}", daemon=True).start()


def load_shard(spec: WorkerSpec, device: torch.device,
               dtype: torch.dtype) -> tuple[MoEShape, ExpertShard, ReadyRecord]:
    """This rank's experts of every MoE layer, and nothing else, through the engine's loader (from
    the checkpoint, or drawn from the random preset with rank 0's seed: the same values)."""
    t0 = time.perf_counter()
    cfg, shard = spec.loader(spec.source, spec.rank, spec.world_size, device, dtype)
    experts = shard.experts
    record = ReadyRecord(rank=spec.rank, host=socket.gethostname(), pid=os.getpid(), device=str(device),
                         gpu=_gpu_id(device), experts=f"{experts.start}..{experts.stop - 1}", bytes=shard.nbytes(),
                         load_s=round(time.perf_counter() - t0, 4))
    return cfg, shard, record


def _rank_device(name: str) -> torch.device:
    """'cuda' without an index means this host's LOCAL_RANK GPU (as torchrun sets it), else GPU 0."""
    device = torch.device(name)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    return device


def _gpu_id(device: torch.device) -> str:
    """The physical GPU behind `device` (so two ranks on one GPU are caught across CUDA_VISIBLE_DEVICES)."""
    if device.type != "cuda":
        return ""
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    return str(uuid) if uuid is not None else f"{socket.gethostname()}:cuda:{device.index}"
