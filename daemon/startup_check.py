"""What `pegainfer serve` and `generate` check on this host before the port is bound or anything
loads: that --model is a checkpoint folder whose config.json pegainfer can run, that the CUDA device
asked for is there, that the EP backend can run here (ep.preflight), that --compile-cache-dir is a
folder it can write (made if missing), and last that serve's host and port can be listened on. A
failure is one line that names the setting and where it came from; the CLI exits 2 (a usage error:
restarting will not fix it, and the systemd unit's RestartPreventExitStatus=2 does not retry it)."""
from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import torch

from pegainfer.daemon.settings import Settings, SettingsError, flag
from pegainfer.engine.config import ConfigError, ModelConfig
from pegainfer.engine.weights import missing_files
from pegainfer.ep.preflight import preflight


def check_model_dir(path: str, source: str = "--model") -> None:
    """`path` is a folder with a checkpoint's files and a config.json that describes a model we run."""
    folder = Path(path)
    if not folder.is_dir():
        raise SettingsError(f"{source}: {folder} is not a folder" if folder.exists()
                            else f"{source}: {folder} does not exist")
    missing = missing_files(folder)
    if missing:
        raise SettingsError(f"{source}: {folder} is not a model folder: it has no {', no '.join(missing)} "
                            f"(a Hugging Face checkpoint folder, e.g. a local copy of DeepSeek-V2-Lite)")
    try:
        ModelConfig.load(folder)
    except ConfigError as e:
        raise SettingsError(f"{source}: {e}") from None


def check_device(device: str, source: str = "--device") -> None:
    """A CUDA device (cuda, cuda:N) is one this process can see."""
    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        why = (f"this torch ({torch.__version__}) is built without CUDA" if torch.version.cuda is None
               else "no CUDA GPU is visible (driver, CUDA_VISIBLE_DEVICES)")
        raise SettingsError(f"{source}: {device} is not available: {why}; use --device cpu")
    index, count = torch.device(device).index or 0, torch.cuda.device_count()
    if index >= count:
        raise SettingsError(f"{source}: {device} is not available: {count} CUDA GPU(s) visible")


def check_compile_cache_dir(path: str, source: str = "--compile-cache-dir") -> Path:
    """`path` is a folder this process can write compiled kernels into; made (with its parents) if
    missing. Returns it, absolute."""
    folder = Path(path).expanduser().absolute()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise SettingsError(f"{source}: {folder} is not a folder") from None
    except OSError as e:
        raise SettingsError(f"{source}: {folder} cannot be made: {e.strerror or e}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SettingsError(f"{source}: {folder} is not writable by this user")
    return folder


def use_compile_cache(folder: Path) -> None:
    """Point Triton's kernel cache (and torch inductor's, should anything compile through it) at
    `folder`, before anything compiles; expert ranks inherit the environment."""
    os.environ["TRITON_CACHE_DIR"] = str(folder / "triton")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "inductor")


def check_port(host: str, port: int, source: str = "--host/--port") -> None:
    """`host`:`port` can be listened on now, as uvicorn will (SO_REUSEADDR: a closed server's
    lingering connections do not count). Port 0 (any free one) is not checked."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise SettingsError(f"{source}: {host} cannot be resolved: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as e:
            why = {errno.EADDRINUSE: "is in use (another server listens there?)",
                   errno.EACCES: "needs privileges this user lacks",
                   errno.EADDRNOTAVAIL: "is not an address of this host"}.get(e.errno, e.strerror or str(e))
            raise SettingsError(f"{source}: {host}:{port} {why}") from None


def check_startup(s: Settings, where: dict[str, str]) -> None:
    """Everything about `s` that needs this host, before the port is bound (daemon.serve); then the
    compile caches go to --compile-cache-dir, before anything compiles."""
    # A test-only backend, nccl without a GPU per rank: its own message, which names the way out.
    preflight(s.backend, s.device, s.ep_size, remote_ranks=s.ep_master_addr is not None)
    check_device(s.device, where.get("device", flag("device")))
    if s.model is not None:
        check_model_dir(s.model, where.get("model", flag("model")))
    if s.compile_cache_dir is not None:
        use_compile_cache(check_compile_cache_dir(s.compile_cache_dir,
                                                  where.get("compile_cache_dir", flag("compile_cache_dir"))))
    # last, so that a setting's own problem is named first
    check_port(s.host, s.port, "/".join(where.get(k, flag(k)) for k in ("host", "port")))
