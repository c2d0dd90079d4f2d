"""systemd/pegainfer.toml documents every setting (meaning and default) and, uncommented, is a valid
config; systemd/pegainfer.env names only variables pegainfer or its libraries read."""
from __future__ import annotations

import argparse
import dataclasses
import re
import tomllib
from pathlib import Path

from pegainfer.daemon.settings import ENV_PREFIX, Settings, resolve

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
KEY_LINE = re.compile(r"^# ?([a-z_]+) = (.+)$")


def _blocks(text: str) -> dict[str, tuple[str, str]]:
    """key -> (its example value, the comment paragraph just above it)."""
    out, comment = {}, []
    for line in text.splitlines():
        m = KEY_LINE.match(line)
        if m:
            out[m.group(1)] = (m.group(2), " ".join(comment))
            comment = []
        elif line.startswith("#"):
            comment.append(line.lstrip("# "))
        else:
            comment = []
    return out


def test_example_config_documents_every_setting():
    blocks = _blocks((SYSTEMD / "pegainfer.toml").read_text())
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    missing = sorted(set(fields) - set(blocks))
    assert not missing, f"add these settings to systemd/pegainfer.toml: {missing}"
    assert not set(blocks) - set(fields), "systemd/pegainfer.toml names settings that do not exist"
    for name, (_, comment) in blocks.items():
        assert fields[name].metadata["help"] in comment, f"{name}: comment lacks its help text"
        assert "Default:" in comment, f"{name}: comment lacks its default"
        default = fields[name].default
        shown = "none" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
        assert shown in comment, f"{name}: comment should give the default {shown}"


def test_example_config_as_shipped_gives_the_defaults(tmp_path):
    settings = resolve(argparse.Namespace(config=str(SYSTEMD / "pegainfer.toml")), environ={})
    assert settings == Settings()
    assert tomllib.loads((SYSTEMD / "pegainfer.toml").read_text()) == {}


def test_example_config_uncommented_is_valid(tmp_path):
    text = (SYSTEMD / "pegainfer.toml").read_text()
    uncommented = "\n".join(re.sub(r"^# ?([a-z_]+ = )", r"\1", line) for line in text.splitlines())
    path = tmp_path / "all.toml"
    path.write_text(uncommented)
    settings = resolve(argparse.Namespace(config=str(path)), environ={})
    table = tomllib.loads(uncommented)
    assert set(table) == set(Settings.field_names())
    for name, value in table.items():
        assert getattr(settings, name) == value


def test_example_env_file_names_real_variables():
    known_other = {"PEGAINFER_CACHE_DIR", "OTEL_EXPORTER_OTLP_ENDPOINT", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG"}
    names = []
    for line in (SYSTEMD / "pegainfer.env").read_text().splitlines():
        if not line or line.startswith("# ") or line == "#":
            continue
        m = re.match(r"^#?([A-Z_][A-Z0-9_]*)=\S*$", line)
        assert m, f"not a comment or NAME=value line: {line!r}"
        names.append(m.group(1))
    settings = {ENV_PREFIX + name.upper() for name in Settings.field_names()}
    assert names and all(n in settings or n in known_other for n in names), names
