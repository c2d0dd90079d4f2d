"""The daemons one --spawn run starts: one at a time, reused while the next scenario wants the same
settings and the process is still up, replaced when it wants others, restarted after a scenario
ended it. Every daemon's trace file, log and exit status stay on record."""
from __future__ import annotations

from pathlib import Path

from tools.reliakit.daemon import SpawnedDaemon


class DaemonPool:
    def __init__(self, work_dir: Path, model: str | None, backend: str, ep_size: int, device: str = "cpu",
                 random_preset: str | None = None):
        self.work_dir = work_dir
        self.base_flags = (["--model", model] if model else []) + \
            (["--random-preset", random_preset] if random_preset else []) + \
            ["--backend", backend, "--ep-size", str(ep_size), "--device", device]
        self.daemons: list[SpawnedDaemon] = []
        self.current: SpawnedDaemon | None = None

    def ensure(self, flags: tuple[str, ...] | list[str]) -> SpawnedDaemon:
        """A ready daemon with these settings: the current one if it fits and is alive, else a new one."""
        cur = self.current
        if cur is not None and cur.alive() and cur.flags == list(flags):
            return cur
        if cur is not None:
            cur.stop()
        return self._start(list(flags))

    def restart(self) -> SpawnedDaemon:
        """A fresh daemon with the current one's settings (after a scenario ended it)."""
        flags = self.current.flags if self.current is not None else []
        if self.current is not None:
            self.current.stop()
        return self._start(flags)

    def _start(self, flags: list[str]) -> SpawnedDaemon:
        d = SpawnedDaemon(len(self.daemons), self.base_flags, flags, self.work_dir)
        self.daemons.append(d)
        self.current = d
        return d.start()

    def stop_all(self) -> None:
        for d in self.daemons:
            d.stop()

    @property
    def trace_files(self) -> list[Path]:
        return [d.trace_file for d in self.daemons]
