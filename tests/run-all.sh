#!/bin/bash
# Install everything the tests need on a fresh Debian 12/13 machine (as root, or with
# sudo), run the unit and Slurm tests in a chroot of the other Debian release, against its
# Slurm (tests/slurm/other-debian.sh: as root only), bring up the Slurm test cluster, and
# run every test. This is the README's test command and what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
# Python 3.11 (the pins need it: the local CPU torch file and megatron-core 0.16.1).
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
  || { echo "tests/run-all.sh: need Python 3.11 (set PYTHON=/path/to/python3.11)" >&2; exit 2; }

echo "== packages (Slurm, munge, slurmdbd + MariaDB for the accounting tests, sqlite3) from the distribution"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  munge slurmctld slurmd slurm-client slurm-wlm-basic-plugins slurmdbd slurm-wlm-mysql-plugin mariadb-server sqlite3 python3-venv gcc libc6-dev musl-tools debootstrap >/dev/null

echo "== python packages (project + dev tools + the megatron extra: CPU torch, megatron-core), in a venv"
# A virtual environment: Debian's own Python refuses pip installs into it (PEP 668), and the
# tests then run exactly what a user who followed the README has.
# Its own folder, not the demo's .venv (that one may hold another Python, e.g. Debian 13's 3.13).
VENV=${PIPESWIFT_VENV:-$PWD/.venv-tests}
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
  echo "tests/run-all.sh: $VENV holds another Python than 3.11; remove it or set PIPESWIFT_VENV" >&2; exit 2
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV" \
  || { echo "tests/run-all.sh: cannot make a venv with $PY (apt-get install python3-venv)" >&2; exit 2; }
PY=$VENV/bin/python
export PATH=$VENV/bin:$PATH
$PY -m pip install -q --disable-pip-version-check -e '.[dev,megatron]'

echo "== the other Slurm: unit and Slurm tests in a chroot of the other Debian release (22.05 <-> 24.11)"
bash tests/slurm/other-debian.sh

echo "== Slurm test cluster"
export SLURM_TESTBED_DIR=${SLURM_TESTBED_DIR:-/tmp/pipeswift-testbed-ci}
FRESH=1 bash tests/slurm/testbed.sh up
trap 'bash tests/slurm/testbed.sh down >/dev/null 2>&1 || true' EXIT
# shellcheck disable=SC1091
source "$SLURM_TESTBED_DIR/env.sh"

echo "== tests"
$PY -m pytest -q -p no:cacheprovider tests "$@"
