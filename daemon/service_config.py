"""The settings file `pegainfer install-service` writes, and the settings the installed service will
run with: the shipped example (or the user's file) with `model` and `device` set in it, and the
settings the daemon resolves from what systemd hands it (the unit's Environment= lines, the
environment file, `serve --config` on that file), so that install-service can refuse a service that
would not start or would serve random weights before it changes anything."""
from __future__ import annotations

import argparse
import re
import tomllib
from importlib import resources

from pegainfer.daemon.settings import Settings, resolve_sourced

CONFIG_FILE = "/etc/pegainfer/pegainfer.toml"  # what the unit's ExecStart passes to `serve --config`
SHIPPED = ("pegainfer.service", "pegainfer.toml", "pegainfer.env")


class MissingData(RuntimeError):
    pass


def shipped(name: str) -> str:
    """One of the files in SHIPPED, as installed with pegainfer (package data pegainfer.systemd)."""
    try:
        return (resources.files("pegainfer.systemd") / name).read_text()
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        raise MissingData(f"pegainfer.systemd/{name} is not installed: reinstall pegainfer "
                          f"(pip install . from a checkout, or its wheel)") from None


def toml_string(value: str) -> str:
    """A TOML basic string holding `value`."""
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def set_keys(text: str, values: dict[str, str]) -> str:
    """`text` with each key set to its value: the key's own line replaced where it has one, else its
    commented example (`# key = ...`) uncommented, else a line added at the end (every setting is a
    top-level key, so the end is still the top-level table)."""
    lines = text.splitlines()
    for key, value in values.items():
        line = f"{key} = {toml_string(value)}"
        at = next((i for i, s in enumerate(lines) if re.match(rf"{key}\s*=", s)), None)
        if at is None:
            at = next((i for i, s in enumerate(lines) if re.match(rf"#\s?{key} = ", s)), None)
        if at is None:
            lines.append(line)
        else:
            lines[at] = line
    out = "\n".join(lines) + "\n"
    table = tomllib.loads(out)
    if any(table.get(k) != v for k, v in values.items()):  # a bug here, never the user's input
        raise RuntimeError(f"set_keys: the settings file does not read back as {values}")
    return out


def _assignments(lines: list[str]) -> dict[str, str]:
    """NAME=value lines as systemd reads them (a value in matching quotes loses them)."""
    out = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        name, _, value = line.partition("=")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[name.strip()] = value
    return out


def service_settings(unit: str, env_file: str, config: str,
                     config_name: str = CONFIG_FILE) -> tuple[Settings, dict[str, str]]:
    """The settings `pegainfer serve --config CONFIG_FILE` resolves under this unit, environment file
    and settings file (given as text; its errors name it config_name), and where each came from;
    SettingsError as serve would raise."""
    environ = _assignments([s.removeprefix("Environment=") for s in unit.splitlines() if s.startswith("Environment=")])
    environ.update(_assignments(env_file.splitlines()))
    return resolve_sourced(argparse.Namespace(config=config_name), environ, config_text=config)
