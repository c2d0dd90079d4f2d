"""Where and when a number was measured: git revision, date, host CPU, GPUs, library versions and
the command line (secrets redacted), for the header of every benchmark report."""
from __future__ import annotations

import datetime
import os
import platform
import shlex
import shutil
import subprocess
from pathlib import Path

from tools.benchkit.redact import redact_argv

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git() -> dict:
    """The revision measured. A copy of the tree without .git (the GPU machine gets one) passes it
    in PEGAINFER_GIT_SHA instead."""
    sha = _run(["git", "rev-parse", "HEAD"])
    if sha is None and os.environ.get("PEGAINFER_GIT_SHA"):
        return {"sha": os.environ["PEGAINFER_GIT_SHA"], "dirty": None}
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return {"sha": sha, "dirty": bool(status) if status is not None else None}


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host() -> dict:
    return {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version()}


def nvidia_smi_gpus() -> list[str]:
    """GPU names on this host without importing torch (the serving client may run where torch is not)."""
    if shutil.which("nvidia-smi") is None:
        return []
    out = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    return [x.strip() for x in out.splitlines() if x.strip()] if out else []


def torch_stack(device: str | None = None) -> dict:
    """torch / CUDA / transformers versions and the GPU the run used (imports torch)."""
    import torch
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": None, "gpu_count": 0}
    if torch.cuda.is_available():
        info["gpu_count"] = torch.cuda.device_count()
        index = torch.device(device).index if device and device.startswith("cuda") else None
        info["gpu"] = torch.cuda.get_device_name(index or 0)
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    return info


def command_line(script: str, argv: list[str]) -> str:
    """The command as a person would retype it from the repository root, secrets redacted
    (tools/benchkit/redact.py): every tool records its command line through here."""
    return shlex.join(["python", script, *redact_argv(argv)])
