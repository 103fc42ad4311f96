#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for trying and testing c2jax's SLURM jobs
# (docs/cluster.md): munged, slurmctld and slurmd, as root, no systemd needed.
#   sudo bash tools/setup_slurm.sh          # install if missing, configure, start (idempotent)
#   sudo bash tools/setup_slurm.sh status   # exit 0 when the node takes jobs
#   sudo bash tools/setup_slurm.sh stop     # stop the daemons (the configuration stays)
# The node is this machine with its CPUs and memory (`slurmd -C`), one partition `c2jax`,
# CPUs as the consumable (two single-CPU tasks fit a 2-core machine), requeue allowed.
# Processes are tracked without cgroups (proctrack/linuxproc, task/none), so it runs in a
# container too. Daemon logs: /var/log/slurm/. The configuration is rewritten only when
# it differs (then the daemons restart).
set -euo pipefail

say() { echo "setup_slurm.sh: $*"; }
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
LOGS=/var/log/slurm
SPOOL=/var/spool/slurm

if [ "$(id -u)" != 0 ]; then
  say "needs root (it installs packages and starts daemons); run it with sudo"
  exit 1
fi

# One set-up at a time (test processes may call it together).
mkdir -p /run/lock
exec 9>/run/lock/c2jax-setup-slurm.lock
flock 9

running() { pgrep -x "$1" >/dev/null 2>&1; }

stop() {
  if running slurmctld || running slurmd; then
    scontrol shutdown >/dev/null 2>&1 || true
    for _ in $(seq 50); do
      running slurmctld || running slurmd || break
      sleep 0.2
    done
    pkill -x slurmd 2>/dev/null || true
    pkill -x slurmctld 2>/dev/null || true
  fi
  if running munged; then
    pkill -x munged 2>/dev/null || true
  fi
  # Gone before a start that follows looks for them (one still saving its state would
  # read as running, and then not be started).
  for _ in $(seq 50); do
    running slurmctld || running slurmd || running munged || break
    sleep 0.2
  done
  say "stopped"
}

node_ready() {  # the node answers and is idle, mixed or allocated (not down/drained)
  local state
  state=$(timeout 10 sinfo --noheader --nodes="$NODE" --format=%t 2>/dev/null | head -1)
  case "$state" in idle|idle~|mix|alloc|comp) return 0 ;; *) return 1 ;; esac
}

NODE=$(hostname -s)
case "${1:-start}" in
  stop) stop; exit 0 ;;
  status) node_ready && { say "node $NODE is up"; exit 0; } || { say "node $NODE is not up"; exit 1; } ;;
  start) ;;
  *) say "unknown command ${1}; use start, status or stop"; exit 2 ;;
esac

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v munged >/dev/null; then
  if ! command -v apt-get >/dev/null; then
    say "slurmctld, slurmd or munged is missing and there is no apt-get to install them"
    exit 1
  fi
  say "installing slurm-wlm and munge (Debian packages)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurm-wlm munge >/dev/null
fi

# munge: the key the packages made, or a new one; the daemon as the munge user.
mkdir -p /etc/munge /var/log/munge /var/lib/munge /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  say "creating a munge key"
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown -R munge:munge /etc/munge /var/log/munge /var/lib/munge /run/munge
chmod 0700 /etc/munge
chmod 0400 /etc/munge/munge.key
if ! running munged; then
  runuser -u munge -- munged 9>&-  # the daemons must not inherit (and hold) the lock
fi

# This machine as the node: slurmd -C prints its CPUs, sockets, cores and memory.
hardware=$(slurmd -C | head -1 | sed "s/^NodeName=[^ ]*/NodeName=$NODE/")
memory=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$hardware")
mkdir -p "$CONF_DIR" "$LOGS" "$SPOOL/ctld" "$SPOOL/d"
wanted=$(cat <<EOF
# Written by c2jax tools/setup_slurm.sh: a one-node cluster on this machine.
ClusterName=c2jax
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=$((memory / 4))
ReturnToService=2
JobRequeue=1
# Seconds between SIGTERM and SIGKILL when a job is cancelled or reaches its time.
KillWait=120
MinJobAge=600
$hardware State=UNKNOWN
PartitionName=c2jax Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
)
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$wanted" ]; then
  if running slurmctld || running slurmd; then
    say "configuration changed; restarting the daemons"
    scontrol shutdown >/dev/null 2>&1 || true
    sleep 1
    pkill -x slurmd 2>/dev/null || true
    pkill -x slurmctld 2>/dev/null || true
  fi
  printf '%s\n' "$wanted" > "$CONF"
  say "wrote $CONF ($NODE: $(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$hardware") CPUs, ${memory} MB)"
fi

if ! running slurmctld; then
  slurmctld 9>&-
fi
if ! running slurmd; then
  slurmd 9>&-
fi
for _ in $(seq 100); do
  if node_ready; then
    say "node $NODE is up (sinfo: $(sinfo --noheader --format='%P %a %D %t' | head -1))"
    exit 0
  fi
  # A node that came back from an earlier run (or a restart) may be down: resume it.
  timeout 10 scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
  sleep 0.2
done
say "the node did not come up; see $LOGS/slurmctld.log and $LOGS/slurmd.log"
exit 1
