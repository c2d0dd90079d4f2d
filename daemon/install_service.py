"""`pegainfer install-service`: puts pegainfer in place as a systemd service on this host: the unit
(rendered with the absolute path of the pegainfer being run, the service account and the GPU groups
that exist), the example config and environment file (never over ones that exist), and the system
account. Idempotent: a second run changes nothing and succeeds. --prefix installs under another root
(a test folder, an image being built) and never touches this host's accounts or systemd."""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "systemd"
UNIT_PATH = "etc/systemd/system/pegainfer.service"
CONFIG_DIR = "etc/pegainfer"
SHIPPED_EXE = "/usr/local/bin/pegainfer"  # the ExecStart path in systemd/pegainfer.service
GPU_GROUPS = ("video", "render")
HIDDEN_BY_PROTECT_HOME = ("/home/", "/root/", "/run/user/")
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


class InstallError(RuntimeError):
    pass


@dataclasses.dataclass(slots=True)
class Installer:
    prefix: Path
    user: str
    dry_run: bool
    exe: list[str]
    changed: int = 0  # files written and accounts created (or, with dry_run, that would be)

    @property
    def on_host(self) -> bool:
        return self.prefix.resolve() == Path("/")

    def run(self) -> None:
        if not USER_NAME.match(self.user):
            raise InstallError(f"--user {self.user!r} is not a valid account name")
        for name in ("pegainfer.service", "pegainfer.toml", "pegainfer.env"):
            if not (SOURCE / name).is_file():
                raise InstallError(f"{SOURCE / name} is missing: run install-service from a pegainfer checkout")
        self.ensure_account()
        unit_changed = self.put(UNIT_PATH, self.render_unit(), 0o644, group=None, replace=True)
        self.put(f"{CONFIG_DIR}/pegainfer.toml", (SOURCE / "pegainfer.toml").read_text(), 0o640,
                 group=self.user, replace=False)
        self.put(f"{CONFIG_DIR}/pegainfer.env", (SOURCE / "pegainfer.env").read_text(), 0o640,
                 group=self.user, replace=False)
        if unit_changed:
            self.daemon_reload()
        for path in (self.exe[0], str(Path(sys.executable).resolve())):
            if path.startswith(HIDDEN_BY_PROTECT_HOME):
                self.say(f"warning: {path} is under /home, /root or /run/user, which ProtectHome=yes hides from the "
                         f"service: install Python and pegainfer elsewhere (e.g. a venv in /opt/pegainfer made "
                         f"from /usr/bin/python3) or relax ProtectHome= with `systemctl edit pegainfer`")

    # ---- the unit ---------------------------------------------------------------------------------
    def render_unit(self) -> str:
        groups = [g for g in GPU_GROUPS if self.group_id(g) is not None]
        out = []
        for line in (SOURCE / "pegainfer.service").read_text().splitlines():
            if line.startswith("ExecStart="):
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
    p.add_argument("--prefix", default="/", help="install under this root instead of / (default /)")
    p.add_argument("--user", default="pegainfer", help="service account, created if missing (default pegainfer)")
    p.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")


def run_install_service(args: argparse.Namespace) -> int:
    installer = Installer(Path(args.prefix), args.user, args.dry_run, entry_point())
    try:
        installer.run()
    except (InstallError, OSError) as e:
        print(f"pegainfer: error: {e}", file=sys.stderr)
        return 1
    if installer.changed == 0:
        print("nothing to change")
    if installer.on_host and not args.dry_run:
        print("next: systemctl enable --now pegainfer && journalctl -u pegainfer -f")
    return 0
