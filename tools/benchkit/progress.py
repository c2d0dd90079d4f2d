"""The benchmark's progress bar: one tqdm bar on stderr over every request of a sweep (warmup, each
level and repeat), its label naming the stage. On only where a person watches: stderr is a
terminal and --no-progress was not given, so that logs, pipes and test output stay clean."""
from __future__ import annotations

import sys
from typing import TextIO


def wanted(no_progress: bool, stream: TextIO | None = None) -> bool:
    stream = sys.stderr if stream is None else stream
    return not no_progress and stream.isatty()


class Progress:
    """A no-op unless enabled (or when tqdm is missing: the benchmark never depends on its bar)."""

    def __init__(self, total: int, *, enabled: bool, file: TextIO | None = None):
        self._bar = None
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, unit="req", file=sys.stderr if file is None else file, dynamic_ncols=True,
                         desc="bench_serving", mininterval=0.2)

    @property
    def active(self) -> bool:
        return self._bar is not None

    def stage(self, label: str) -> None:
        if self._bar is not None:
            self._bar.set_description(label, refresh=True)

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
