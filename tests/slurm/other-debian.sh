#!/bin/bash
# Run the Slurm integration tests against the other supported Slurm too: on Debian 12 (Slurm
# 22.05) inside a Debian 13 chroot (Slurm 24.11), on Debian 13 inside a Debian 12 one. The
# chroot is built with debootstrap from the mirror this machine's apt already uses, holds
# that release's own Slurm, munge, Python and compiler, and is kept for the next run. Its
# test cluster (tests/slurm/testbed.sh) listens on other ports than the main one. The unit
# tests run there too, on that release's Python (3.13 on Debian 13): what an admin would run
# the controller and psbatch with. Only the Megatron tests (torch) stay on the machine's own.
#
#   bash tests/slurm/other-debian.sh [pytest args]     (default: tests/unit tests/integration)
#
# tests/run-all.sh (the README's test command, and CI) runs it first. It needs root (chroot,
# mounts); elsewhere, or with PIPESWIFT_OTHER_SLURM=0, it says why it skips and exits 0.
#   OTHER_DEBIAN_DIR=/var/tmp/pipeswift-<release>   where the chroot lives
#   OTHER_CTLD_PORT=6917 OTHER_SLURMD_PORT_BASE=17101   its test cluster's ports (the host's
#                                                   network: two chroots at once need others)
#   PIPESWIFT_SHARED=<checkout>/../shared           where pyslurm-24.11.0.tar.gz is looked for
# On Debian 13 (the Slurm 24.11 chroot) pyslurm 24.11.0 is built from the shared source
# (vendor/pyslurm-24.11.0.tar.gz; never part of the project) into the chroot's venv, and the
# wheel is kept in the chroot for the next run; without that file the pyslurm leg is skipped
# with one line (tests/integration/test_backend_pyslurm_live.py then skips).
# MariaDB and slurmdbd (the accounting tests: sacct --json, QOS limits) are installed into the
# chroot when missing, old chroots included; where apt cannot, those tests skip at once.
# PIPESWIFT_*_PORT and PIPESWIFT_*_PORT_BASE variables (the live tests' own ports) are passed in.
set -euo pipefail
cd "$(dirname "$0")/../.."
say() { echo "[other-debian] $*"; }

if [ "${PIPESWIFT_OTHER_SLURM:-1}" = 0 ]; then say "skipped (PIPESWIFT_OTHER_SLURM=0)"; exit 0; fi
# shellcheck disable=SC1091
. /etc/os-release
case "${VERSION_CODENAME:-}" in
  bookworm) SUITE=trixie ;;
  trixie) SUITE=bookworm ;;
  *) say "skipped: ${PRETTY_NAME:-this system} is neither Debian 12 nor Debian 13"; exit 0 ;;
esac
if [ "$(id -u)" != 0 ]; then say "skipped: needs root (debootstrap, chroot, mounts)"; exit 0; fi
command -v debootstrap >/dev/null || { say "needs debootstrap (apt-get install debootstrap)"; exit 2; }
DIR=$(realpath -m "${OTHER_DEBIAN_DIR:-/var/tmp/pipeswift-$SUITE}")
[ "$DIR" != / ] || { say "OTHER_DEBIAN_DIR must not be /"; exit 2; }
PACKAGES=slurmctld,slurmd,slurm-client,slurm-wlm-basic-plugins,munge,sqlite3,procps,ca-certificates
PACKAGES=$PACKAGES,python3,python3-venv,gcc,libc6-dev,musl-tools
PYSLURM_PACKAGES="libslurm-dev python3-dev"   # building pyslurm (Debian 13 only)
DBD_PACKAGES="mariadb-server slurmdbd slurm-wlm-mysql-plugin"   # the accounting tests
[ "$SUITE" != trixie ] || PACKAGES=$PACKAGES,${PYSLURM_PACKAGES// /,}
CTLD_PORT=${OTHER_CTLD_PORT:-6917}
SLURMD_PORT_BASE=${OTHER_SLURMD_PORT_BASE:-17101}
SHARED=${PIPESWIFT_SHARED:-$(dirname "$PWD")/shared}
PYSLURM_SRC=$SHARED/vendor/pyslurm-24.11.0.tar.gz
TESTBED=/tmp/pipeswift-testbed-other   # the chroot's test cluster, on ports the main one leaves free

stop_inside() {  # every process whose root is the chroot (slurmctld, slurmd, munged, ...)
  local p pids=()
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$DIR" ] && pids+=("${p#/proc/}")
  done
  [ ${#pids[@]} = 0 ] || { kill "${pids[@]}" 2>/dev/null; sleep 1; kill -9 "${pids[@]}" 2>/dev/null; } || true
}
mounts_under() {  # mount points inside the chroot, deepest first
  awk -v d="$DIR/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r
}
release_mounts() {  # this run's, or what a killed run left mounted (/proc, /sys, /dev)
  local m
  while read -r m; do umount -R "$m" 2>/dev/null || umount -l "$m" || true; done < <(mounts_under)
}
stop_inside
release_mounts
if [ -n "$(mounts_under)" ]; then say "something is still mounted under $DIR; not touching it"; exit 1; fi

if [ ! -e "$DIR/.pipeswift-ready" ]; then
  say "building a Debian $SUITE chroot in $DIR (once; a few minutes)"
  # the mirror apt uses here for this release's main component (no host is written down)
  MIRROR=$(apt-cache policy | awk -v s="$VERSION_CODENAME/main" '$3 == s && $2 ~ /^https?:/ {print $2; exit}')
  [ -n "$MIRROR" ] || { say "no Debian mirror in apt's sources (run apt-get update)"; exit 2; }
  ok=0
  for attempt in 1 2; do
    rm -rf --one-file-system "$DIR"
    if debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$DIR" "$MIRROR" >"/tmp/debootstrap-$SUITE.log" 2>&1; then
      ok=1; break
    fi
    say "debootstrap failed (attempt $attempt): $(tail -1 "/tmp/debootstrap-$SUITE.log")"
  done
  [ "$ok" = 1 ] || exit 1
  touch "$DIR/.pipeswift-ready"
fi

cleanup() {
  chroot "$DIR" /bin/bash -c "cd /root/pipeswift && SLURM_TESTBED_DIR=$TESTBED bash tests/slurm/testbed.sh down" \
    >/dev/null 2>&1 || true
  stop_inside
  release_mounts
}
trap cleanup EXIT
mount_in() {  # mount_in <target under DIR> <mount args...>
  local target=$DIR/$1; shift
  mount "$@" "$target"
  mount --make-rslave "$target"   # nothing unmounted in here reaches this machine's mounts
}
mount_in proc --bind /proc
mount_in sys --rbind /sys     # with cgroups: 24.11's slurmd refuses to start without them
mount_in dev --bind /dev
mount_in dev/pts --bind /dev/pts
mount_in dev/shm -t tmpfs tmpfs
cp /etc/resolv.conf "$DIR/etc/resolv.conf"

# pip inside trusts what pip trusts here (a site's CA bundle, if one is set).
CERT_ENV=()
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
  cp "$PIP_CERT" "$DIR/etc/ssl/pipeswift-host-ca.pem"
  CERT_ENV=(PIP_CERT=/etc/ssl/pipeswift-host-ca.pem SSL_CERT_FILE=/etc/ssl/pipeswift-host-ca.pem)
fi
inside() {
  chroot "$DIR" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_DISABLE_PIP_VERSION_CHECK=1 "${CERT_ENV[@]}" /bin/bash -c "$1"
}

# This checkout's files (tracked and new, not ignored), fresh each run.
rm -rf --one-file-system "$DIR/root/pipeswift" && mkdir -p "$DIR/root/pipeswift"
if git rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -C "$DIR/root/pipeswift" -xf -
else
  tar --exclude=.git -cf - . | tar -C "$DIR/root/pipeswift" -xf -
fi

inside 'set -e; [ -x /root/venv/bin/python ] || python3 -m venv /root/venv
        /root/venv/bin/pip install -q -e "/root/pipeswift[dev]"'
say "$(inside 'slurmctld -V; /root/venv/bin/python --version' | tr '\n' ' ')"

# MariaDB + slurmdbd for the accounting tests (tests/slurm/testbed.sh ACCOUNTING=dbd), also
# into a chroot built before they were wanted; postinst cannot start MariaDB here (no init),
# testbed.sh starts its own. Without them those tests skip with one line, at once.
if ! inside "dpkg -s $DBD_PACKAGES >/dev/null 2>&1"; then
  T0=$SECONDS
  if inside "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
             --no-install-recommends $DBD_PACKAGES >/tmp/apt-dbd.log 2>&1"; then
    say "$DBD_PACKAGES installed in $((SECONDS - T0)) s"
  else
    say "accounting tests will skip: apt could not install $DBD_PACKAGES (log: $DIR/tmp/apt-dbd.log)"
  fi
fi

# pyslurm 24.11.0 for the live pyslurm backend tests: built once per source (wheel cached in
# the chroot), installed into the venv. Cython < 3.1: the tag has a typo newer Cython rejects.
if [ "$SUITE" != trixie ]; then
  say "pyslurm leg skipped: Debian $SUITE's Slurm has no matching pyslurm release"
elif [ ! -f "$PYSLURM_SRC" ]; then
  say "pyslurm leg skipped: no shared source at $PYSLURM_SRC"
else
  SUM=$(sha256sum "$PYSLURM_SRC" | cut -c1-16)
  mkdir -p "$DIR/root/pyslurm-wheels/$SUM"
  if ! ls "$DIR/root/pyslurm-wheels/$SUM"/pyslurm-*.whl >/dev/null 2>&1; then
    say "building pyslurm 24.11.0 from $PYSLURM_SRC (once per source; a few minutes)"
    T0=$SECONDS
    cp "$PYSLURM_SRC" "$DIR/root/pyslurm-wheels/$SUM/src.tar.gz"
    inside "set -e; dpkg -s $PYSLURM_PACKAGES >/dev/null 2>&1 || { apt-get update -qq
              DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PYSLURM_PACKAGES >/dev/null; }
            cd /root/pyslurm-wheels/$SUM && echo 'Cython<3.1' > constraints.txt
            PIP_CONSTRAINT=\$PWD/constraints.txt SLURM_INCLUDE_DIR=/usr/include \
              SLURM_LIB_DIR=/usr/lib/x86_64-linux-gnu PYSLURM_BUILD_JOBS=\$(nproc) \
              /root/venv/bin/pip wheel -q --no-deps -w . ./src.tar.gz >build.log 2>&1 \
              || { tail -5 build.log; exit 1; }
            rm -f src.tar.gz" || { say "pyslurm build failed (log: $DIR/root/pyslurm-wheels/$SUM/build.log)"; exit 1; }
    say "pyslurm built in $((SECONDS - T0)) s"
  fi
  inside "/root/venv/bin/pip install -q --no-deps /root/pyslurm-wheels/$SUM/pyslurm-*.whl" \
    || { say "pyslurm wheel does not install"; exit 1; }
fi
[ $# -gt 0 ] || set -- tests/unit tests/integration
ARGS=$(printf ' %q' "$@")
# the live tests' own ports (e.g. PIPESWIFT_SACCT_DBD_PORT), for two runs on one host at once
PORTS=$(env | grep -E '^PIPESWIFT_[A-Z0-9_]*_PORT(_BASE)?=[0-9]+$' | sed 's/^/export /' || true)
inside "set -e; cd /root/pipeswift
        $PORTS
        export SLURM_TESTBED_DIR=$TESTBED CTLD_PORT=$CTLD_PORT SLURMD_PORT_BASE=$SLURMD_PORT_BASE
        export PATH=/root/venv/bin:\$PATH
        FRESH=1 bash tests/slurm/testbed.sh up
        source \$SLURM_TESTBED_DIR/env.sh
        /root/venv/bin/python -m pytest -q -p no:cacheprovider -m 'not megatron' $ARGS"
