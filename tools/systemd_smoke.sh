#!/usr/bin/env bash
# Run pegainfer under a real systemd on a machine that does not boot with one (a CI VM, a container
# host without docker): systemd becomes PID 1 of new PID, mount and cgroup namespaces, sees a private
# /run, throwaway overlays over /etc and /var, and only a handful of units. Inside,
# `pegainfer install-service` runs for real (creates the account, writes the unit and config), then
# systemd starts the service exactly as on a server. Nothing on the host changes; `down` removes it all.
#
#   tools/systemd_smoke.sh check           boot, enable --now, query, stall-kill-restart, stop, tear down
#   tools/systemd_smoke.sh up WORKDIR      boot and leave it running (WORKDIR: an empty folder)
#   tools/systemd_smoke.sh ctl WORKDIR CMD run CMD inside, e.g. `systemctl status pegainfer`
#   tools/systemd_smoke.sh down WORKDIR    stop systemd and remove what `up` made
#   tools/systemd_smoke.sh preflight       exit 0 if this machine can run the rest, else say why
#
# Before `up`, WORKDIR/pegainfer.env.extra (appended to /etc/pegainfer/pegainfer.env) and
# WORKDIR/smoke.conf (a drop-in for pegainfer.service) may be written to tune the service.
# Needs root, unshare(1), overlayfs and a cgroup2 mount; refuses to run where systemd is already PID 1.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PEGAINFER=${PEGAINFER:-$REPO/.venv/bin/pegainfer}
SYSTEMD=/usr/lib/systemd/systemd
UNITS=/usr/lib/systemd/system

die() { echo "systemd_smoke: $*" >&2; exit 1; }

preflight() {
  [ "$(id -u)" = 0 ] || die "needs root (namespaces, overlays, cgroups)"
  [ -x "$SYSTEMD" ] || die "no $SYSTEMD: apt-get install -y --no-install-recommends systemd"
  { command -v unshare && command -v nsenter; } >/dev/null || die "needs unshare and nsenter (util-linux)"
  [ ! -d /run/systemd/system ] || die "systemd already runs this host: use install-service and systemctl directly"
  grep -qw overlay /proc/filesystems || die "no overlayfs in this kernel"
  cgroup2 >/dev/null || die "no cgroup2 mount"
  [ -x "$PEGAINFER" ] || die "no $PEGAINFER (make install)"
}

cgroup2() { awk '$3 == "cgroup2" && !found { print $2; found = 1 } END { exit !found }' /proc/mounts; }

inside() { local w=$1; shift; nsenter --target "$(cat "$w/pid")" --mount --pid -- "$@"; }

# The units systemd gets: stub targets for boot ordering, journald, and the real shutdown chain
# (`systemctl exit` in a container). Nothing else from the host's unit folders is visible.
write_units() {
  local d=$1
  mkdir -p "$d"
  for t in basic sockets network-online multi-user; do
    printf '[Unit]\nDescription=%s (smoke stub)\n' "$t" >"$d/$t.target"
  done
  printf '[Unit]\nDescription=sysinit (smoke stub)\nWants=systemd-journald.socket systemd-journald.service\n' \
    >"$d/sysinit.target"
  for u in systemd-journald.service systemd-journald.socket systemd-journald-dev-log.socket \
           shutdown.target umount.target final.target exit.target systemd-exit.service; do
    cp "$UNITS/$u" "$d/"
  done
}

up() {
  local w=$1
  preflight
  mkdir -p "$w"
  w=$(cd "$w" && pwd)
  case $w in /root/*|/home/*) die "WORKDIR must be outside /root and /home (they may be masked inside)" ;; esac
  write_units "$w/units"
  mkdir -p "$w/empty" "$w/etc-systemd"
  local cg
  cg="$(cgroup2)/pegainfer-smoke-$$"
  mkdir "$cg"
  echo "$cg" >"$w/cgroup"
  ( echo "$BASHPID" >"$cg/cgroup.procs"
    exec setsid unshare --pid --fork --mount --cgroup "$0" __pid1 "$w" ) >"$w/console.log" 2>&1 </dev/null &
  for _ in $(seq 300); do
    if [ -s "$w/pid" ] && state=$(inside "$w" systemctl is-system-running 2>/dev/null); then
      case $state in running|degraded) echo "systemd up: PID $(cat "$w/pid") on the host ($state)"; return 0 ;; esac
    fi
    [ -s "$w/failed" ] && die "boot failed: $(cat "$w/failed"); see $w/console.log"
    sleep 0.1
  done
  die "systemd did not come up in 30 s; see $w/console.log and $w/install.log"
}

# PID 1 of the new namespaces, until it becomes systemd.
pid1() {
  local w=$1
  trap 'echo "line $LINENO" >"$w/failed"' ERR
  read -r hostpid _ </proc/self/stat  # still the host's /proc: our PID as the host sees it
  mount --make-rprivate /
  mount -t proc proc /proc
  mount -t tmpfs -o mode=0755 tmpfs /run
  umount -l /sys/fs/cgroup 2>/dev/null || true
  mount -t cgroup2 cgroup2 /sys/fs/cgroup  # rooted at our cgroup namespace
  for d in etc var; do
    mkdir -p "$w/$d.upper" "$w/$d.work"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$w/$d.upper,workdir=$w/$d.work" "/$d"
  done
  mount --bind "$w/units" "$UNITS"
  mount --bind "$w/empty" /usr/lib/systemd/system-generators
  mount --bind "$w/etc-systemd" /etc/systemd/system
  local python
  python=$(readlink -f "$(dirname "$PEGAINFER")/python")
  local protect_home=""
  case $python in
    /root/*|/home/*)
      # This host's Python lives in a home folder, which the unit's ProtectHome=yes hides (install-service
      # warns about it). Here: a /root that shows only that Python, traversable, and ProtectHome=read-only.
      local prefix home
      prefix=$(dirname "$(dirname "$python")")  # e.g. /root/.pyenv/versions/3.11.7
      home=/$(echo "${python#/}" | cut -d/ -f1)  # /root or /home
      mkdir -p "$w/home-python"
      mount --bind "$prefix" "$w/home-python"
      mount -t tmpfs -o mode=0711 tmpfs "$home"
      mkdir -p "$prefix"
      mount --bind "$w/home-python" "$prefix"
      protect_home="ProtectHome=read-only" ;;
  esac
  # The smoke serves the embedded tiny model, which install-service refuses unless told. A checkout under
  # /tmp (CI clones can live there) needs PrivateTmp=no, or the service could not see the venv and the
  # editable source; a real install lives elsewhere (README).
  local flags=(--allow-tiny-model)
  case "$(readlink -f "$PEGAINFER") $REPO" in
    /tmp/*|/var/tmp/*|*" /tmp/"*|*" /var/tmp/"*) flags+=(--no-private-tmp) ;;
  esac
  "$PEGAINFER" install-service "${flags[@]}" >"$w/install.log" 2>&1
  if [ -f "$w/pegainfer.env.extra" ]; then cat "$w/pegainfer.env.extra" >>/etc/pegainfer/pegainfer.env; fi
  mkdir -p /etc/systemd/system/pegainfer.service.d
  if [ -n "$protect_home" ]; then
    printf '# smoke: this host'"'"'s Python is under %s\n[Service]\n%s\n' "$python" "$protect_home" \
      >/etc/systemd/system/pegainfer.service.d/home-python.conf
  fi
  if [ -f "$w/smoke.conf" ]; then cp "$w/smoke.conf" /etc/systemd/system/pegainfer.service.d/; fi
  echo "$hostpid" >"$w/pid"
  export container=pegainfer-smoke
  exec "$SYSTEMD" --system --unit=multi-user.target --log-target=journal --show-status=no
}

down() {
  local w=$1
  if [ -s "$w/pid" ] && kill -0 "$(cat "$w/pid")" 2>/dev/null; then
    inside "$w" systemctl exit 0 >/dev/null 2>&1 || true
    for _ in $(seq 100); do kill -0 "$(cat "$w/pid")" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$(cat "$w/pid")" 2>/dev/null || true  # PID 1 gone: the kernel ends the whole namespace
    for _ in $(seq 50); do kill -0 "$(cat "$w/pid")" 2>/dev/null || break; sleep 0.1; done
  fi
  if [ -s "$w/cgroup" ] && [ -d "$(cat "$w/cgroup")" ]; then
    find "$(cat "$w/cgroup")" -depth -type d -exec rmdir {} + 2>/dev/null || true
  fi
  rm -f "$w/pid"
}

check() {
  local w port ok=1
  w=$(mktemp -d /tmp/pegainfer-smoke.XXXXXX)
  CHECK_DIR=$w
  trap 'down "$CHECK_DIR"; rm -rf "$CHECK_DIR"' EXIT
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  printf 'PEGAINFER_PORT=%s\nPEGAINFER_DEBUG_HOOKS=true\n' "$port" >"$w/pegainfer.env.extra"
  printf '[Service]\nWatchdogSec=3s\nRestartSec=1s\n' >"$w/smoke.conf"
  up "$w"
  echo "+ systemctl enable --now pegainfer"; inside "$w" systemctl enable --now pegainfer
  inside "$w" systemctl --no-pager status pegainfer | head -n 12
  echo "+ curl /ready"; curl -fsS "http://127.0.0.1:$port/ready"; echo
  echo "+ stall the GPU thread for 20 s (WatchdogSec=3s)"
  curl -fsS -X POST "http://127.0.0.1:$port/debug/stall?seconds=20"; echo
  for _ in $(seq 150); do
    [ "$(inside "$w" systemctl show -P NRestarts pegainfer)" = 1 ] && break; sleep 0.1
  done
  inside "$w" systemctl is-active pegainfer >/dev/null || inside "$w" systemctl start pegainfer
  echo "restarts after the stall: $(inside "$w" systemctl show -P NRestarts pegainfer)"
  echo "+ systemctl stop pegainfer"; inside "$w" systemctl stop pegainfer
  inside "$w" systemctl show -p Result -p ExecMainCode -p ExecMainStatus pegainfer
  inside "$w" journalctl -u pegainfer --no-pager -o cat | grep -E 'Watchdog|watchdog|Main process exited|"serving"|"stopped"|Started|Stopped' || true
  [ "$(inside "$w" systemctl show -P NRestarts pegainfer)" = 1 ] || { echo "FAIL: watchdog did not restart"; ok=0; }
  [ "$(inside "$w" systemctl show -P Result pegainfer)" = success ] || { echo "FAIL: stop was not clean"; ok=0; }
  [ $ok = 1 ] && echo "systemd smoke: OK"
  [ $ok = 1 ]
}

case ${1:-} in
  up) up "${2:?WORKDIR}" ;;
  ctl) w=${2:?WORKDIR}; shift 2; inside "$w" "$@" ;;
  down) down "${2:?WORKDIR}" ;;
  check) check ;;
  preflight) preflight ;;
  __pid1) pid1 "$2" ;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
