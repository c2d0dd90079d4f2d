"""`pegainfer install-service`: puts pegainfer in place as a systemd service on this host: the unit
(rendered with the absolute path of the pegainfer being run, the service account and the GPU groups
that exist), the settings file (the shipped example or --config, with --model and --device set in it)
and the environment file (never over ones that exist), and the system account. Before it changes
anything it refuses (exit 2) a service that could not start or would serve random weights: settings
the daemon would refuse, no --model (unless --allow-tiny-model), a model folder that is not one, and
a pegainfer or model under /tmp, which the unit's PrivateTmp=yes hides. Idempotent: a second run
changes nothing and succeeds. --prefix installs under another root (a test folder, an image being
built) and never touches this host's accounts or systemd. The shipped files are package data
(pegainfer.systemd), so an install from a wheel works as well as a checkout."""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from pegainfer.daemon.errors import CliError
from pegainfer.daemon.service_config import CONFIG_FILE, MissingData, service_settings, set_keys, shipped
from pegainfer.daemon.settings import Settings, SettingsError, device_arg, flag
from pegainfer.daemon.startup_check import check_device, check_model_dir

UNIT_PATH = "etc/systemd/system/pegainfer.service"
CONFIG_DIR = "etc/pegainfer"
SHIPPED_EXE = "/usr/local/bin/pegainfer"  # the ExecStart path in systemd/pegainfer.service
GPU_GROUPS = ("video", "render")
HIDDEN_BY_PROTECT_HOME = ("/home/", "/root/", "/run/user/")
HIDDEN_BY_PRIVATE_TMP = ("/tmp/", "/var/tmp/")
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


class InstallError(RuntimeError):
    pass


@dataclasses.dataclass(slots=True)
class Installer:
    prefix: Path
    user: str
    dry_run: bool
    exe: list[str]
    model: str | None = None  # --model: set as `model` in the settings file
    device: str | None = None  # --device: set as `device`
    config: str | None = None  # --config: the settings file to start from instead of the shipped example
    allow_tiny_model: bool = False
    private_tmp: bool = True  # False: the unit gets PrivateTmp=no (--no-private-tmp)
    changed: int = 0  # files written and accounts created (or, with dry_run, that would be)
    warnings: list[str] = dataclasses.field(default_factory=list)  # said once every check has passed

    @property
    def on_host(self) -> bool:
        return self.prefix.resolve() == Path("/")

    def run(self) -> None:
        if not USER_NAME.match(self.user):
            raise CliError(f"--user {self.user!r} is not a valid account name")
        # Everything is checked before anything changes.
        unit = self.render_unit()
        for path in self.program_paths():
            self.check_visible(path, "pegainfer",
                               "install it elsewhere (e.g. a venv in /opt/pegainfer made from /usr/bin/python3)")
        config, config_name = self.config_text()
        env = self.existing(f"{CONFIG_DIR}/pegainfer.env")
        env = shipped("pegainfer.env") if env is None else env
        settings, where = service_settings(unit, env, config, config_name)
        self.check_model(settings, where)
        if settings.device.startswith("cuda"):
            try:
                check_device(settings.device, "--device" if self.device else where.get("device", flag("device")))
            except SettingsError as e:  # this may not be the host that will run it (an image, a driver not loaded)
                self.warnings.append(f"{e} (the service will not start on this host as it is)")
        for line in self.warnings:
            self.say(f"warning: {line}")
        served = settings.model or (f"random weights ({settings.random_preset})" if settings.random_preset
                                    else "the embedded tiny model")
        self.say(f"the service will serve {served} on {settings.device} (backend {settings.backend}, "
                 f"settings in {CONFIG_FILE})")
        self.ensure_account()
        unit_changed = self.put(UNIT_PATH, unit, 0o644, group=None, replace=True)
        self.put(f"{CONFIG_DIR}/pegainfer.toml", config, 0o640, group=self.user, replace=False)
        self.put(f"{CONFIG_DIR}/pegainfer.env", env, 0o640, group=self.user, replace=False)
        if unit_changed:
            self.daemon_reload()

    # ---- what the service will run ----------------------------------------------------------------
    def program_paths(self) -> list[str]:
        """Where the service's program lives: the script, what it links to, the Python, the package."""
        here = Path(__file__).resolve().parents[1]
        return list(dict.fromkeys([self.exe[0], str(Path(self.exe[0]).resolve()), str(Path(sys.executable).resolve()),
                                   str(here)]))

    def check_visible(self, path: str, what: str, elsewhere: str) -> None:
        """Refuse a path PrivateTmp=yes hides; warn about one ProtectHome=yes hides."""
        if self.private_tmp and (path + "/").startswith(HIDDEN_BY_PRIVATE_TMP):
            raise CliError(f"{what} is under /tmp or /var/tmp ({path}), which the unit's PrivateTmp=yes hides "
                           f"from the service: {elsewhere}, or pass --no-private-tmp")
        if (path + "/").startswith(HIDDEN_BY_PROTECT_HOME):
            self.warnings.append(f"{path} is under /home, /root or /run/user, which the unit's ProtectHome=yes "
                                 f"hides from the service: {elsewhere}, or relax ProtectHome= with "
                                 f"`systemctl edit pegainfer`")

    def existing(self, rel: str) -> str | None:
        path = self.prefix / rel
        return path.read_text() if path.exists() else None

    def config_text(self) -> tuple[str, str]:
        """The settings file the service will read, and the name to report it by: the one already
        installed (never replaced), else --config or the shipped example, with --model and --device
        set. An installed one that says otherwise than --config, --model or --device is refused
        rather than silently kept."""
        values = {k: v for k, v in (("model", self.model), ("device", self.device)) if v is not None}
        try:
            base = Path(self.config).read_text() if self.config else shipped("pegainfer.toml")
        except OSError as e:
            raise CliError(f"--config {self.config}: {e.strerror}") from None
        wanted = set_keys(base, values) if values else base
        installed, path = self.existing(f"{CONFIG_DIR}/pegainfer.toml"), self.prefix / CONFIG_DIR / "pegainfer.toml"
        if installed is None:
            return wanted, self.config or CONFIG_FILE
        try:
            have, want = tomllib.loads(installed), tomllib.loads(wanted)
        except tomllib.TOMLDecodeError:
            return installed, str(path)  # its error, with its name, comes from the settings check
        asked = set(want) if self.config else set(values)
        differ = sorted(k for k in asked | (set(have) if self.config else set()) if have.get(k) != want.get(k))
        if differ:
            def shown(table: dict) -> str:
                return ", ".join(f"{k} = {table[k]!r}" if k in table else f"no {k}" for k in differ)
            raise CliError(f"{path} exists with {shown(have)}, not {shown(want)}: edit it, or move it away and "
                           f"run install-service again")
        return installed, str(path)

    def check_model(self, s: Settings, where: dict[str, str]) -> None:
        source = "--model" if self.model else where.get("model", CONFIG_FILE)
        if s.model is None:
            what = (f"random weights of the {s.random_preset} preset" if s.random_preset
                    else "the embedded tiny model (a 2.9M-parameter demo trained on Python sources)")
            if not self.allow_tiny_model:
                raise CliError(f"the service would serve {what}: give --model DIR (a checkpoint folder the "
                               f"service can read), or --allow-tiny-model to install it anyway")
            self.warnings.append(f"the service will serve {what} (--allow-tiny-model)")
            return
        if not Path(s.model).is_absolute():
            raise CliError(f"{source}: {s.model} is not an absolute path (the service runs in /var/lib/pegainfer)")
        self.check_visible(s.model, "the model folder", "move it (e.g. to /var/lib/pegainfer/models)")
        check_model_dir(str(self.prefix / s.model.lstrip("/")), source)

    # ---- the unit ---------------------------------------------------------------------------------
    def render_unit(self) -> str:
        groups = [g for g in GPU_GROUPS if self.group_id(g) is not None]
        out = []
        for line in shipped("pegainfer.service").splitlines():
            if line == "PrivateTmp=yes" and not self.private_tmp:
                out.append("# install-service --no-private-tmp: pegainfer (or its model) lives under /tmp")
                line = "PrivateTmp=no"
            elif line.startswith("ExecStart="):
                line = line.replace(SHIPPED_EXE, shlex.join(self.exe), 1)
            elif line.startswith("User="):
                line = f"User={self.user}"
            elif line.startswith("Group="):
                line = f"Group={self.user}"
            elif line.startswith("SupplementaryGroups="):
                if not groups:
                    continue
                line = "SupplementaryGroups=" + " ".join(groups)
            out.append(line)
        return "\n".join(out) + "\n"

    # ---- files ------------------------------------------------------------------------------------
    def put(self, rel: str, text: str, mode: int, group: str | None, replace: bool) -> bool:
        """Write prefix/rel unless it already holds exactly this (replace) or exists at all (not replace)."""
        path = self.prefix / rel
        if path.exists() and (not replace or (path.read_text() == text and path.stat().st_mode & 0o777 == mode)):
            self.say(f"unchanged {path}" if replace else f"kept {path} (exists; not overwritten)")
            return False
        self.changed += 1
        if self.dry_run:
            self.say(f"would write {path}")
            return True
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.chmod(tmp, mode)
        gid = self.group_id(group) if group else 0
        if os.geteuid() == 0 and gid is not None:
            os.chown(tmp, 0, gid)
        os.replace(tmp, path)
        self.say(f"wrote {path}")
        return True

    # ---- the account ------------------------------------------------------------------------------
    def ensure_account(self) -> None:
        if self.user_exists(self.user):
            self.say(f"unchanged user {self.user}")
            return
        if not self.on_host and not (self.prefix / "etc/passwd").is_file():
            self.say(f"skipped user {self.user}: {self.prefix}/etc/passwd does not exist")
            return
        cmd = ["useradd", "--system", "--no-create-home", "--home-dir", "/var/lib/pegainfer",
               "--shell", "/usr/sbin/nologin", "--comment", "pegainfer inference server"]
        cmd += ["--gid", self.user] if self.group_id(self.user) is not None else ["--user-group"]
        if not self.on_host:
            cmd += ["--prefix", str(self.prefix)]
        cmd.append(self.user)
        self.changed += 1
        if self.dry_run:
            self.say(f"would run {shlex.join(cmd)}")
            return
        done = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise InstallError(f"{shlex.join(cmd)} failed: {done.stderr.strip() or done.returncode}")
        self.say(f"created user {self.user}")

    def user_exists(self, name: str) -> bool:
        if self.on_host:
            import pwd
            try:
                pwd.getpwnam(name)
                return True
            except KeyError:
                return False
        return _field(self.prefix / "etc/passwd", name) is not None

    def group_id(self, name: str) -> int | None:
        if self.on_host:
            import grp
            try:
                return grp.getgrnam(name).gr_gid
            except KeyError:
                return None
        gid = _field(self.prefix / "etc/group", name)
        return int(gid) if gid is not None and gid.isdigit() else None

    # ---- systemd ----------------------------------------------------------------------------------
    def daemon_reload(self) -> None:
        # Only on this host, and only when systemd runs it (sd_booted's test): quietly nothing otherwise.
        if not self.on_host or not Path("/run/systemd/system").is_dir() or not shutil.which("systemctl"):
            return
        if self.dry_run:
            self.say("would run systemctl daemon-reload")
            return
        done = subprocess.run(["systemctl", "daemon-reload"], check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise InstallError(f"systemctl daemon-reload failed: {done.stderr.strip()}")
        self.say("ran systemctl daemon-reload")

    def say(self, line: str) -> None:
        print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout)


def _field(path: Path, name: str) -> str | None:
    """The id field (3rd) of `name` in a passwd- or group-format file, None if absent."""
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        parts = line.split(":")
        if len(parts) > 2 and parts[0] == name:
            return parts[2]
    return None


def entry_point() -> list[str]:
    """How the service should start this pegainfer: the `pegainfer` script being run, else the one
    beside this Python, else this Python with -m. Symlinks are kept: a venv's bin/ is the stable name."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "pegainfer" and argv0.is_file():
        return [str(argv0.absolute())]
    beside = Path(sys.executable).absolute().parent / "pegainfer"
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("pegainfer")
    if found:
        return [str(Path(found).absolute())]
    return [str(Path(sys.executable).absolute()), "-m", "pegainfer.daemon.cli"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="DIR", help="the checkpoint folder the service serves (set as `model` in "
                   "the settings file; the service user must be able to read it, e.g. /var/lib/pegainfer/models/NAME)")
    p.add_argument("--device", type=device_arg, metavar="{cpu,cuda,cuda:N}",
                   help="set as `device` in the settings file")
    p.add_argument("--config", metavar="FILE.toml", help="install this settings file (checked as `serve --config` "
                   "would) instead of the commented example")
    p.add_argument("--allow-tiny-model", action="store_true", help="install a service that serves the embedded "
                   "tiny demo model (trained on Python sources, a smoke test); refused otherwise")
    p.add_argument("--no-private-tmp", dest="private_tmp", action="store_false", help="write PrivateTmp=no into "
                   "the unit, for a pegainfer or model under /tmp (refused otherwise: PrivateTmp=yes hides /tmp)")
    p.add_argument("--prefix", default="/", help="install under this root instead of / (default /); the settings' "
                   "paths are the service's own, so --model is looked for under this root too")
    p.add_argument("--user", default="pegainfer", help="service account, created if missing (default pegainfer)")
    p.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")


def run_install_service(args: argparse.Namespace) -> int:
    model = str(Path(args.model).absolute()) if args.model else None
    installer = Installer(Path(args.prefix), args.user, args.dry_run, entry_point(), model=model, device=args.device,
                          config=args.config, allow_tiny_model=args.allow_tiny_model, private_tmp=args.private_tmp)
    try:
        installer.run()
    except (InstallError, MissingData, OSError) as e:
        print(f"pegainfer: error: {e}", file=sys.stderr)
        return 1
    if installer.changed == 0:
        print("nothing to change")
    if installer.on_host and not args.dry_run:
        print("next: systemctl enable --now pegainfer && journalctl -u pegainfer -f")
    return 0
