"""The tools' one-line command-line errors: `fail(prog, message)` prints `PROG: error: MESSAGE` on one
line and exits 2; `Parser` is argparse with that form instead of its usage block."""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn


def fail(prog: str, message: str) -> NoReturn:
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(2)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        fail(self.prog, message)
