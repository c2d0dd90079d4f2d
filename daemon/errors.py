"""Errors the command line reports as one line: a bad command line (exit 2)."""
from __future__ import annotations


class CliError(Exception):
    """A problem with the command line itself (exit 2)."""
