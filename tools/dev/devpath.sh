#!/usr/bin/env bash
# The checkout as the installed `pegainfer` package without pip (the GPU machine's image has no
# package index and no build backend to spare): a folder holding pegainfer/<pkg> -> ./<pkg> links,
# printed for PYTHONPATH. Code changes in the checkout are live through the links.
# Usage: export PYTHONPATH=$(bash tools/dev/devpath.sh [DIR]):$PYTHONPATH
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-/tmp/pegainfer-dev}
mkdir -p "$dir/pegainfer"
for pkg in daemon engine ep lifecycle telemetry systemd; do  # systemd: data only (install-service)
  ln -sfn "$root/$pkg" "$dir/pegainfer/$pkg"
done
echo "$dir"
