"""`pegainfer serve` checks every setting before it binds its port or loads anything: a bad value from
a flag, a PEGAINFER_* variable or the --config file is one line naming where it came from, and exit
status 2 (as is a model folder that is not one, a CUDA device that is not there, a backend that
cannot run here). Also `serve --help` (choices listed, each default once) and `pegainfer --version`."""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from pegainfer.daemon.cli import main
from pegainfer.daemon.settings import Settings, SettingsError, resolve, resolve_sourced
from pegainfer.daemon.startup_check import check_compile_cache_dir, check_device, check_model_dir, check_startup
from tests.daemon_process import ROOT


@pytest.fixture
def held_port():
    """A port this test listens on: a daemon that tried to bind it would fail with a second message."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_bad_settings_exit_2_with_one_line_before_binding(tmp_path, held_port):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "x").write_text("a file, not a folder")
    serve = [sys.executable, "-m", "pegainfer.daemon.cli", "serve", "--port", str(held_port)]
    # (TOML files, the other flags and nccl on CPU: the same code, in process below and in test_serving.py)
    cases = {  # name: (argv, extra environment, what the one line says)
        "log level": (serve + ["--log-level", "verbose"], {}, ["--log-level: 'verbose' is not a log level",
                                                                "critical, error, warning, info, debug"]),
        "backend": (serve + ["--backend", "foo"], {}, ["--backend: 'foo' is not an EP backend",
                                                        "local, host-staged, nccl"]),
        "device": (serve + ["--device", "gpu"], {}, ["--device: 'gpu' is not a device", "cuda:N"]),
        "model": (serve + ["--model", str(empty)], {}, [f"--model: {empty} is not a model folder", "no config.json",
                                                         "no tokenizer.json"]),
        "env": (serve, {"PEGAINFER_LOG_LEVEL": "verbose"}, ["environment PEGAINFER_LOG_LEVEL: 'verbose'"]),
        "compile cache": (serve + ["--compile-cache-dir", str(empty / "x" / "y")],
                          {"PEGAINFER_COMPILE_CACHE_DIR": str(tmp_path)}, [f"--compile-cache-dir: {empty}/x/y cannot"]),
        "port in use": (serve, {}, [f"--host/--port: 127.0.0.1:{held_port} is in use"]),
        "bad host": (serve + ["--host", "no-such-host.invalid"], {}, ["--host/--port: no-such-host.invalid cannot be "
                                                                      "resolved"]),
        "generate": ([sys.executable, "-m", "pegainfer.daemon.cli", "generate", "--model", str(empty), "--prompt",
                      "hi", "--max-tokens", "2"], {}, ["is not a model folder"]),
    }
    if not torch.cuda.is_available():
        cases["cuda"] = (serve + ["--device", "cuda"], {}, ["--device: cuda is not available", "--device cpu"])
    procs = {name: subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, (argv, env, _) in cases.items()}
    for name, p in procs.items():
        out, err = p.communicate(timeout=120)
        assert p.returncode == 2, (name, out, err)
        assert out == "" and "Traceback" not in err, (name, out, err)
        [line] = err.splitlines()  # nothing loaded, nothing bound: no start-up log, no bind error
        assert line.startswith("pegainfer"), (name, line)
        assert all(n in line for n in cases[name][2]), (name, line)


@pytest.mark.parametrize("name, value, says", [
    ("log_level", "verbose", "'verbose' is not a log level"),
    ("backend", "foo", "'foo' is not an EP backend"),
    ("device", "gpu", "'gpu' is not a device"),
    ("device", "cuda:x", "'cuda:x' is not a device"),
    ("random_preset", "huge", "'huge' is not a preset (one of lite, tiny)"),
    ("max_pending", "-1", "max_pending must be >= 0"),
])
def test_every_source_is_checked_the_same_way(name, value, says, tmp_path):
    flag = "--" + name.replace("_", "-")
    config = tmp_path / "s.toml"
    config.write_text(f"{name} = {json.dumps(int(value) if value.lstrip('-').isdigit() else value)}\n")
    sources = {
        flag: (argparse.Namespace(**{name: value}), {}),
        f"environment PEGAINFER_{name.upper()}": (argparse.Namespace(), {f"PEGAINFER_{name.upper()}": value}),
        f"{config}: {name}": (argparse.Namespace(config=str(config)), {}),
    }
    for label, (args, environ) in sources.items():
        with pytest.raises(SettingsError) as e:
            resolve(args, environ)
        assert says in str(e.value), str(e.value)
        if name != "max_pending":  # the range checks predate the source labels
            assert str(e.value).startswith(f"{label}: "), str(e.value)


def test_the_compile_cache_dir_comes_from_every_source_is_made_and_set_for_triton(tmp_path, monkeypatch):
    from pegainfer.daemon import startup_check
    monkeypatch.setattr(startup_check, "check_port", lambda *a: None)  # the default port may be taken here
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    config = tmp_path / "s.toml"
    config.write_text(f'compile_cache_dir = "{tmp_path}/toml"\n')
    sources = {"flag": (argparse.Namespace(compile_cache_dir=str(tmp_path / "flag")), {}),
               "env": (argparse.Namespace(), {"PEGAINFER_COMPILE_CACHE_DIR": str(tmp_path / "env")}),
               "toml": (argparse.Namespace(config=str(config)), {})}
    for name, (args, environ) in sources.items():
        s, where = resolve_sourced(args, environ)
        assert s.compile_cache_dir == str(tmp_path / name)
        check_startup(s, where)
        assert (tmp_path / name).is_dir() and os.environ["TRITON_CACHE_DIR"] == str(tmp_path / name / "triton")
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / name / "inductor")
    (tmp_path / "file").write_text("")
    s, where = resolve_sourced(argparse.Namespace(), {"PEGAINFER_COMPILE_CACHE_DIR": str(tmp_path / "file")})
    with pytest.raises(SettingsError, match=r"^environment PEGAINFER_COMPILE_CACHE_DIR: .*file is not a folder$"):
        check_startup(s, where)
    assert Settings().compile_cache_dir is None and Settings().mixed_step_tokens == 8192
    with pytest.raises(SettingsError, match="mixed_step_tokens must be at least 1"):
        resolve(argparse.Namespace(mixed_step_tokens="0"), {})
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(SettingsError, match="is not writable"):
            check_compile_cache_dir(str(locked))


def test_good_values_pass_and_the_log_level_is_case_blind():
    s = resolve(argparse.Namespace(log_level="DEBUG", backend="host-staged", device="cuda:1", random_preset="tiny"), {})
    assert (s.log_level, s.backend, s.device, s.random_preset) == ("debug", "host-staged", "cuda:1", "tiny")


def test_a_model_folder_is_checked_for_what_it_lacks(tmp_path, tiny_model_dir):
    check_model_dir(str(tiny_model_dir))
    with pytest.raises(SettingsError, match="does not exist"):
        check_model_dir(str(tmp_path / "nowhere"))
    (tmp_path / "file").write_text("")
    with pytest.raises(SettingsError, match="is not a folder"):
        check_model_dir(str(tmp_path / "file"))
    (tmp_path / "part").mkdir()
    (tmp_path / "part" / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    with pytest.raises(SettingsError) as e:
        check_model_dir(str(tmp_path / "part"), "PEGAINFER_MODEL")
    assert str(e.value).startswith("PEGAINFER_MODEL: ") and "no config.json" not in str(e.value)
    assert "no tokenizer.json, no model.safetensors.index.json or model.safetensors" in str(e.value)
    for name in ("tokenizer.json", "model.safetensors.index.json"):
        (tmp_path / "part" / name).symlink_to(tiny_model_dir / name)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    (tmp_path / "part" / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(SettingsError, match="model_type.*llama"):  # the config is read before anything binds
        check_model_dir(str(tmp_path / "part"))


def test_a_cuda_device_must_be_there():
    check_device("cpu")
    if torch.cuda.is_available():
        check_device("cuda")
        with pytest.raises(SettingsError, match="cuda:99 is not available"):
            check_device("cuda:99")
    else:
        with pytest.raises(SettingsError, match="--device: cuda:0 is not available: .*use --device cpu"):
            check_device("cuda:0")


def test_serve_help_lists_choices_and_says_each_default_once(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # unwrapped
    for choices in ("--backend {local,host-staged,nccl}", "--device {cpu,cuda,cuda:N}",
                    "--log-level {critical,error,warning,info,debug}", "--dtype {float32,bfloat16}",
                    "--random-preset {lite,tiny}"):
        assert choices in text, choices
    assert "(default: None)" not in text
    assert "HF checkpoint folder (default: the embedded tiny model) --random-preset" in text
    assert "listen port (default: 8000)" in text and "serve recent spans at /debug/traces (default: off)" in text


def test_version_is_the_package_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"pegainfer {importlib.metadata.version('pegainfer')}\n"


def test_a_bad_command_line_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--port"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == "pegainfer serve: error: argument --port: expected one argument (see pegainfer serve --help)\n"
