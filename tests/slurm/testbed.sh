#!/bin/bash
# pipeswift-slurm's own single-machine Slurm test cluster.
#
#   tests/slurm/testbed.sh [up|down|status|restart]      (default: up)
#
# One munged (shared, left running), one slurmctld and NODES slurmd processes in Slurm's
# multiple-slurmd mode (node1..nodeN on one host, one port each), fake CPUs/memory and fake
# GPUs (symlinks to /dev/null, which Slurm accepts as character devices). No systemd needed:
# every path (config, state, spool, logs, pids) lives under $SLURM_TESTBED_DIR and clients
# find the cluster through SLURM_CONF. Nothing is written to /etc/slurm.
# Works with Debian 12 (Slurm 22.05) and Debian 13 (Slurm 24.11): config lines that a
# version removed are emitted only for the versions that know them.
#
# Environment (all optional):
#   SLURM_TESTBED_DIR=/tmp/pipeswift-testbed   config + state + logs
#   NODES=4 GPUS=8 CPUS=64 MEM_MB=512000       per virtual node (may exceed the real host)
#   GPU_TYPE=                                  e.g. a100 -> typed GRES gpu:a100:8
#   GPU_PARTITIONS=                            e.g. "a100:2 h100:2:4": a mixed cluster, one partition
#                                              per item (TYPE:NODES[:GPUS]) named after its GPU
#                                              type, its nodes with typed GRES gpu:TYPE:GPUS (GPUS
#                                              default $GPUS); replaces NODES, GPU_TYPE and the
#                                              'gpu' partition; the first is the default partition
#   CTLD_PORT=6817 SLURMD_PORT_BASE=17001      pick others to run a second, isolated cluster
#   DEFAULT_TIME_MIN=60                        partition DefaultTime (sane StartTime estimates)
#   ACCOUNTING=none|dbd                        dbd: MariaDB + slurmdbd so that sacct works
#   DBD_PORT=6819                              its database is slurm_acct_db_$DBD_PORT (MariaDB is
#                                              shared by every cluster on the host; FRESH=1 drops it)
#   FRESH=1                                    wipe saved state on 'up' (job ids restart at 1)
#   SLURM_CONF_EXTRA='K=V\nK2=V2'              extra slurm.conf lines (newline-separated); a key
#                                              given here replaces the script's own line for it,
#                                              e.g. SLURM_CONF_EXTRA=$'PriorityWeightJobSize=1000\n
#                                              SchedulerParameters=bf_interval=5,sched_interval=2'
#   INSTALL=1                                  apt-get install missing packages (run
#                                              'apt-get update' first on a fresh machine)
#
# After 'up':  source "$SLURM_TESTBED_DIR/env.sh"   (exports SLURM_CONF and PATH)
set -euo pipefail

ACTION=${1:-up}
DIR=${SLURM_TESTBED_DIR:-/tmp/pipeswift-testbed}
NODES=${NODES:-4}
GPUS=${GPUS:-8}
CPUS=${CPUS:-64}
MEM_MB=${MEM_MB:-512000}
GPU_TYPE=${GPU_TYPE:-}
CTLD_PORT=${CTLD_PORT:-6817}
SLURMD_PORT_BASE=${SLURMD_PORT_BASE:-17001}
DEFAULT_TIME_MIN=${DEFAULT_TIME_MIN:-60}
ACCOUNTING=${ACCOUNTING:-none}
DBD_PORT=${DBD_PORT:-6819}
HOST=$(hostname -s)
SBIN=/usr/sbin
export SLURM_CONF=$DIR/etc/slurm.conf

T0=$(date +%s.%N)
say() { echo "[$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')s] $*"; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
ctld_alive() { alive "$DIR/run/slurmctld.pid"; }

stop_all() {
  local pids=() f p any
  if ctld_alive; then
    # cancel jobs first so that their slurmstepd can report back and exit
    local jobs; jobs=$(timeout 10 squeue -h -o %A 2>/dev/null || true)
    [ -n "$jobs" ] && { timeout 10 scancel --quiet --full $jobs 2>/dev/null || true; }
    for _ in $(seq 1 25); do [ -z "$(timeout 5 squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  for f in "$DIR"/run/slurmd-*.pid "$DIR"/run/slurmctld.pid "$DIR"/run/slurmdbd.pid; do
    alive "$f" && pids+=("$(cat "$f")")
  done
  if [ ${#pids[@]} -gt 0 ]; then
    kill "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 1 50); do
      any=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && any=1; done
      [ $any = 0 ] && break; sleep 0.2
    done
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null; done
  fi
  rm -f "$DIR"/run/*.pid
  # orphaned slurmstepd of THIS cluster only (its environment holds our SLURM_CONF)
  for p in $(pgrep -x slurmstepd 2>/dev/null || true); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_CONF=$SLURM_CONF"; then
      kill -9 "$p" 2>/dev/null || true
    fi
  done
  # munged (and MariaDB) stay up on purpose: other clusters on this host may share them.
}

status() {
  local f
  for f in "$DIR"/run/*.pid; do
    [ -f "$f" ] || continue
    if alive "$f"; then s=up; else s=dead; fi
    echo "$(basename "$f" .pid) pid=$(cat "$f") $s"
  done
  ctld_alive && timeout 10 sinfo -N -o '%N %T %c %m %G' 2>&1 || echo "slurmctld of $DIR is not running"
}

case "$ACTION" in
  down) stop_all; say "test cluster in $DIR stopped"; exit 0 ;;
  status) status; exit 0 ;;
  restart) "$0" down; exec "$0" up ;;
  up) ;;
  *) echo "usage: $0 [up|down|status|restart]" >&2; exit 2 ;;
esac

# ------------------------------------------------------------------ packages
install_pkgs() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >/dev/null
}
if [ "${INSTALL:-1}" = 1 ]; then
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
      || ! command -v squeue >/dev/null || ! command -v munged >/dev/null; then
    install_pkgs munge slurmctld slurmd slurm-client slurm-wlm-basic-plugins
    say "apt: munge + slurm installed"
  fi
  if [ "$ACCOUNTING" = dbd ] && ! command -v slurmdbd >/dev/null; then
    install_pkgs mariadb-server slurmdbd slurm-wlm-mysql-plugin
    say "apt: mariadb-server + slurmdbd installed"
  fi
fi
command -v slurmctld >/dev/null || { echo "slurmctld not installed (INSTALL=1 installs it)" >&2; exit 1; }

# ------------------------------------------------------------------ munge
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
      || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
  fi
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  # munged refuses to run as root without --force: run it as the munge user
  su -s /bin/sh munge -c /usr/sbin/munged
  for _ in $(seq 1 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  say "munged started"
fi

# ------------------------------------------------------------------ config
mkdir -p "$DIR"/{etc,run,log,state,fakedev}
if [ "${FRESH:-0}" = 1 ]; then stop_all; rm -rf "$DIR"/state/* "$DIR"/spool-*; fi

VERSION=$("$SBIN/slurmctld" -V | awk '{print $2}')
MAJOR=${VERSION%%.*}
# One group of nodes per partition: name, GPU type ("": untyped), node count, GPUs per node.
PART_NAMES=(); PART_TYPES=(); PART_NODES=(); PART_GPUS=()
if [ -n "${GPU_PARTITIONS:-}" ]; then
  for item in $GPU_PARTITIONS; do
    IFS=: read -r ptype pnodes pgpus extra <<<"$item"
    if ! [[ "$ptype" =~ ^[a-z][a-z0-9_]*$ && "$pnodes" =~ ^[1-9][0-9]*$ && "${pgpus:-$GPUS}" =~ ^[1-9][0-9]*$ \
          && -z "$extra" ]]; then
      echo "GPU_PARTITIONS: bad item '$item' (TYPE:NODES[:GPUS], e.g. a100:2 or h100:2:4)" >&2; exit 2
    fi
    PART_NAMES+=("$ptype"); PART_TYPES+=("$ptype"); PART_NODES+=("$pnodes"); PART_GPUS+=("${pgpus:-$GPUS}")
  done
  NODES=0; for n in "${PART_NODES[@]}"; do NODES=$((NODES + n)); done
else
  PART_NAMES=(gpu); PART_TYPES=("$GPU_TYPE"); PART_NODES=("$NODES"); PART_GPUS=("$GPUS")
fi
gres_of() {  # gres_of TYPE GPUS
  if [ -n "$1" ]; then echo "gpu:$1:$2"; else echo "gpu:$2"; fi
}
SOCKETS=2; CORES=$((CPUS / SOCKETS))

write_conf() {
cat <<EOF
# generated by tests/slurm/testbed.sh for Slurm $VERSION
ClusterName=pswifttest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool-%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
PriorityType=priority/multifactor
PriorityWeightAge=1000
PriorityWeightPartition=1000
PriorityMaxAge=1-0
PriorityCalcPeriod=1
ReturnToService=2
MinJobAge=600
KillWait=5
MessageTimeout=10
GresTypes=gpu
SlurmdParameters=config_overrides
EOF
# removed options: SwitchType (switch/none plugin gone in 23.02); CredType defaults to
# cred/munge everywhere, so it is not written at all.
[ "$MAJOR" -lt 23 ] && echo "SwitchType=switch/none"
if [ "$ACCOUNTING" = dbd ]; then
cat <<EOF
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
EOF
fi
# (AccountingStorageHost is the address, not $HOST: a chroot's /etc/hosts may not know this
#  machine's name, and slurmctld then waits on slurmdbd for ever. Without dbd: no
#  AccountingStorageType line; 'none' is the default in every version and
#  gres/gpu TRES without slurmdbd is fatal in 22.05)
local g first last=0 default=YES members
for g in "${!PART_NAMES[@]}"; do
  first=$((last + 1)); last=$((last + PART_NODES[g]))
  echo "NodeName=node[$first-$last] NodeHostname=$HOST NodeAddr=127.0.0.1" \
    "Port=[$((SLURMD_PORT_BASE + first - 1))-$((SLURMD_PORT_BASE + last - 1))] CPUs=$CPUS Boards=1" \
    "SocketsPerBoard=$SOCKETS CoresPerSocket=$CORES ThreadsPerCore=1 RealMemory=$MEM_MB" \
    "Gres=$(gres_of "${PART_TYPES[g]}" "${PART_GPUS[g]}") State=UNKNOWN"
  [ ${#PART_NAMES[@]} = 1 ] && members=ALL || members="node[$first-$last]"
  echo "PartitionName=${PART_NAMES[g]} Nodes=$members Default=$default" \
    "DefaultTime=$DEFAULT_TIME_MIN MaxTime=INFINITE State=UP"
  default=NO
done
}

write_gres() {
  # 22.05 drops GPUs without File= ("Removing file-less GPU"); File= must be a char/block
  # device, and /dev/null symlinks are accepted without a warning.
  local n=0 i g k gpus typekv
  echo "AutoDetect=off"
  for g in "${!PART_NAMES[@]}"; do
    gpus=${PART_GPUS[g]}; typekv=${PART_TYPES[g]:+Type=${PART_TYPES[g]}}
    for k in $(seq 1 "${PART_NODES[g]}"); do
      n=$((n + 1))
      for i in $(seq 0 $((gpus - 1))); do ln -sfn /dev/null "$DIR/fakedev/node$n-gpu$i"; done
      echo "NodeName=node$n Name=gpu $typekv File=$DIR/fakedev/node$n-gpu[0-$((gpus - 1))]"
    done
  done
}

# SLURM_CONF_EXTRA: its keys replace the script's lines for them, then its lines are appended
with_extra() {
  local extra=${SLURM_CONF_EXTRA:-} keys
  if [ -z "$extra" ]; then cat; return; fi
  keys=$(printf '%s\n' "$extra" | sed -n 's/^[[:space:]]*\([A-Za-z]*\)=.*/\1/p' | paste -sd'|')
  if [ -n "$keys" ]; then grep -Eiv "^($keys)=" || true; else cat; fi
  printf '%s\n' "$extra"
}
write_conf | with_extra > "$DIR/etc/slurm.conf.new"
write_gres > "$DIR/etc/gres.conf.new"
CHANGED=0
for f in slurm.conf gres.conf; do
  if cmp -s "$DIR/etc/$f.new" "$DIR/etc/$f"; then rm -f "$DIR/etc/$f.new"
  else CHANGED=1; mv "$DIR/etc/$f.new" "$DIR/etc/$f"; fi
done
if [ $CHANGED = 1 ] && ctld_alive; then say "config changed: restarting daemons"; stop_all; fi

cat > "$DIR/env.sh" <<EOF
export SLURM_CONF=$SLURM_CONF
export SLURM_TESTBED_DIR=$DIR
EOF

# ------------------------------------------------------------------ accounting (optional)
start_dbd() {
  # mariadb-admin and mariadb: names that MariaDB 10.11 (Debian 12) and 11.8 (Debian 13) both
  # have (11.x calls the mysql* ones deprecated)
  local sock=/run/mysqld/mysqld.sock
  if ! mariadb-admin --socket=$sock ping >/dev/null 2>&1; then
    mkdir -p /run/mysqld "$DIR/mariadb" && chown mysql:mysql /run/mysqld "$DIR/mariadb"
    # pid and log files must sit in a directory owned by mysql, or mariadbd dies silently;
    # unix socket only (slurmdbd uses it): a MariaDB of the Debian 13 chroot may hold TCP 3306
    setsid /usr/sbin/mariadbd --user=mysql --socket=$sock \
      --pid-file="$DIR/mariadb/mariadb.pid" --skip-networking \
      --innodb-buffer-pool-size=128M --log-error="$DIR/mariadb/mariadb.log" </dev/null >/dev/null 2>&1 &
    for _ in $(seq 1 150); do mariadb-admin --socket=$sock ping >/dev/null 2>&1 && break; sleep 0.2; done
    mariadb-admin --socket=$sock ping >/dev/null 2>&1 \
      || { echo "mariadb did not start" >&2; tail -20 "$DIR/mariadb/mariadb.log" >&2; exit 1; }
    say "mariadb started"
  fi
  # one database per slurmdbd port: clusters on the same MariaDB (all named pswifttest,
  # job ids from 1 after FRESH) must never see each other's jobs in sacct
  DBD_DB=slurm_acct_db_$DBD_PORT
  if [ "${FRESH:-0}" = 1 ] && ! alive "$DIR/run/slurmdbd.pid"; then
    mariadb --socket=$sock -e "DROP DATABASE IF EXISTS $DBD_DB" >/dev/null 2>&1 || true
  fi
  # Made here, not by slurmdbd: when the database is missing, slurmdbd 24.11 creates it and
  # connects again on the handle whose first connect failed; with Debian 13's client library
  # (libmariadb3 of MariaDB 11.8) every query on that handle then fails ("5027 Number of
  # columns in result (=1) set execeeds maxmimum allowed number of columns (=0)") and
  # slurmdbd stops ("fatal: _check_mysql_concat_is_sane: null result from query").
  mariadb --socket=$sock -e "CREATE DATABASE IF NOT EXISTS $DBD_DB" \
    || { echo "cannot create the accounting database $DBD_DB in MariaDB" >&2; exit 1; }
  cat > "$DIR/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=$DBD_DB
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
DebugLevel=info
EOF
  chmod 600 "$DIR/etc/slurmdbd.conf"
  if ! alive "$DIR/run/slurmdbd.pid"; then
    rm -f "$DIR/run/slurmdbd.pid"   # a dead one's would read as "stopped at start"
    "$SBIN/slurmdbd"
    for _ in $(seq 1 150); do
      (exec 3<>"/dev/tcp/127.0.0.1/$DBD_PORT") 2>/dev/null && break
      [ -f "$DIR/run/slurmdbd.pid" ] && ! alive "$DIR/run/slurmdbd.pid" && break
      sleep 0.2
    done
    alive "$DIR/run/slurmdbd.pid" || { echo "slurmdbd did not start: $(grep -m1 -E 'fatal|error' \
      "$DIR/log/slurmdbd.log" 2>/dev/null || echo 'see its log')" >&2; exit 1; }
    say "slurmdbd started"
  fi
}
[ "$ACCOUNTING" = dbd ] && start_dbd

# ------------------------------------------------------------------ daemons
if ! ctld_alive; then
  rm -f "$DIR/run/slurmctld.pid"   # a dead one's: the checks below read the pid file
  "$SBIN/slurmctld" -f "$SLURM_CONF"
  # the daemon writes its pid file a moment after the command returns (seconds on a busy host)
  for _ in $(seq 1 100); do [ -s "$DIR/run/slurmctld.pid" ] && break; sleep 0.1; done
  say "slurmctld started"
fi
for n in $(seq 1 "$NODES"); do
  mkdir -p "$DIR/spool-node$n"   # before slurmd starts, or its domain socket fails
  alive "$DIR/run/slurmd-node$n.pid" || "$SBIN/slurmd" -f "$SLURM_CONF" -N "node$n"
done

ok=0; states=""
# a deadline, not a count: a slurmctld that does not answer makes each sinfo wait 10 s
READY_BY=$((SECONDS + 60))
while [ $SECONDS -lt $READY_BY ]; do
  ctld_alive || { echo "slurmctld died:" >&2; tail -5 "$DIR/log/slurmctld.log" >&2; exit 1; }
  states=$(timeout 10 sinfo -h -N -o '%T' 2>/dev/null | sort -u | tr '\n' ' ') || true
  if [ -n "$states" ] && ! echo "$states" | grep -qE 'unk|down|drain|inval|not_resp|\*'; then ok=1; break; fi
  sleep 0.5
done
if [ $ok != 1 ]; then
  echo "cluster did not become ready: $states" >&2; tail -20 "$DIR/log/slurmctld.log" >&2; exit 1
fi
READY=$(for g in "${!PART_NAMES[@]}"; do
  printf '%s: %s x %s, ' "${PART_NAMES[g]}" "${PART_NODES[g]}" "$(gres_of "${PART_TYPES[g]}" "${PART_GPUS[g]}")"
done)
say "Slurm $VERSION ready: $NODES nodes x ($CPUS cpus, $MEM_MB MB; ${READY%, }); source $DIR/env.sh"
