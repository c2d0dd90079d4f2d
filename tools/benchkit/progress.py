"""A progress bar for long benchmark loops: tqdm when installed, else rich, else nothing. Only on an
interactive terminal, so logs and test output stay quiet."""
from __future__ import annotations

import sys


class Progress:
    def __init__(self, total: int, label: str):
        self.total, self.label = total, label
        self._bar = None
        self._rich = None

    def __enter__(self) -> Progress:
        if not sys.stderr.isatty():
            return self
        try:
            from tqdm import tqdm
            self._bar = tqdm(total=self.total, desc=self.label, unit="req", leave=False)
            return self
        except ImportError:
            pass
        try:
            from rich.progress import Progress as RichProgress
            self._rich = RichProgress(transient=True)
            self._rich.start()
            self._bar = self._rich.add_task(self.label, total=self.total)
        except ImportError:
            pass
        return self

    def advance(self, n: int = 1) -> None:
        if self._rich is not None:
            self._rich.advance(self._bar, n)
        elif self._bar is not None:
            self._bar.update(n)

    def __exit__(self, *exc) -> None:
        if self._rich is not None:
            self._rich.stop()
        elif self._bar is not None:
            self._bar.close()
