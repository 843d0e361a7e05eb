#!/usr/bin/env bash
# Start a real single-node Slurm cluster (slurmctld + one slurmd + munged) from Debian packages, without systemd,
# for tests/integration/test_slurm_teardown.py. Needs root. Idempotent: a second run with the cluster already up
# (same slurm.conf) only re-checks it; a partial or stale cluster is stopped and started again.
#
# The cluster is private to $RGT_SLURM_STATE: its config is $RGT_SLURM_STATE/slurm.conf (callers export
# SLURM_CONF to it; the CLI tools and the teardown role's `scancel` read it from there), its ports are the two
# given, its state, logs and pid files live under that dir. Two test runs on one machine (CI runners share a
# box) each start their own cluster and never stop or scancel the other's; /etc/slurm is not touched.
# No accounting (accounting_storage/none: sacct does not work, squeue/scontrol do), proctrack/pgid, task/none.
#
# Knobs: RGT_SLURM_STATE=/tmp/rgt-slurm (keep it short: slurmd puts unix sockets under it),
#        RGT_SLURM_CTLD_PORT=6817, RGT_SLURM_D_PORT=6818, RGT_SLURM_CPUS=2, RGT_SLURM_INSTALL=1 (0: never apt-get),
#        RGT_SLURM_WAIT_S=60 (bound on each wait).
# Exit: 0 up and idle; 2 not root; 3 packages missing and cannot be installed; 1 a daemon did not come up.
set -euo pipefail

STATE=${RGT_SLURM_STATE:-/tmp/rgt-slurm}
CPUS=${RGT_SLURM_CPUS:-2}
WAIT_S=${RGT_SLURM_WAIT_S:-60}
CTLD_PORT=${RGT_SLURM_CTLD_PORT:-6817}
D_PORT=${RGT_SLURM_D_PORT:-6818}
CONF=$STATE/slurm.conf
export SLURM_CONF=$CONF
NODE=$(hostname -s)
T0=$(date +%s%N)

say() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf 'start-slurm: %s (+%d.%03ds)\n' "$*" $((ms / 1000)) $((ms % 1000)); }
die() { echo "start-slurm: $2" >&2; exit "$1"; }

[ "$(id -u)" = 0 ] || die 2 "needs root (installs packages, runs slurmd and munged as munge)"

# 1. packages, only when missing
need=()
for bin in /usr/sbin/slurmctld:slurmctld /usr/sbin/slurmd:slurmd /usr/bin/scancel:slurm-client \
           /usr/sbin/munged:munge; do
    [ -x "${bin%%:*}" ] || need+=("${bin##*:}")
done
if [ ${#need[@]} -gt 0 ]; then
    [ "${RGT_SLURM_INSTALL:-1}" = 1 ] || die 3 "missing packages ${need[*]} and RGT_SLURM_INSTALL=0"
    command -v apt-get >/dev/null || die 3 "missing packages ${need[*]} and no apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt_install() { apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=600 "${need[@]}"; }
    apt_install >/dev/null 2>&1 || { apt-get update -o DPkg::Lock::Timeout=600 >/dev/null 2>&1 && apt_install >/dev/null; } \
        || die 3 "apt-get install ${need[*]} failed"
    say "installed ${need[*]}"
fi

# 2. slurm.conf (single node, no accounting)
mkdir -p "$STATE"/{run,ctld,spool,log}
want=$(cat <<EOF
# written by rgt tests/slurm/start-slurm.sh; the CLI tools read it through SLURM_CONF
ClusterName=rgt$CTLD_PORT
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$D_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MinJobAge=3600
KillWait=5
InactiveLimit=0
Waittime=0
MessageTimeout=30
SlurmctldTimeout=120
SlurmdTimeout=300
NodeName=$NODE NodeHostname=$NODE NodeAddr=127.0.0.1 Port=$D_PORT CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
)

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$(cat "$1")/status" 2>/dev/null; }
node_state() { local out; out=$(sinfo -h -n "$NODE" -o %T 2>/dev/null) || true; echo "$out"; }

# already up with this exact config? then nothing to do
if [ -f "$CONF" ] && [ "$(cat "$CONF")" = "$want" ] && alive "$STATE/run/slurmctld.pid" \
   && alive "$STATE/run/slurmd.pid" && pgrep -u munge -x munged >/dev/null; then
    st=$(node_state)
    case "$st" in idle|allocated|mixed) say "already up (node $NODE $st)"; exit 0 ;; esac
fi

# stale or partial: stop what runs under our pid files, then write the config and start clean
if alive "$STATE/run/slurmctld.pid" || alive "$STATE/run/slurmd.pid"; then
    say "stale cluster, restarting"
    RGT_SLURM_STATE=$STATE bash "$(dirname "$0")/stop-slurm.sh" >/dev/null 2>&1 || true
fi
printf '%s\n' "$want" > "$CONF"
chmod 644 "$CONF"

# 3. munged
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! pgrep -u munge -x munged >/dev/null; then
    [ -s /etc/munge/munge.key ] || { runuser -u munge -- /usr/sbin/mungekey --create 2>/dev/null || true; }
    runuser -u munge -- /usr/sbin/munged
fi
munge -n | unmunge >/dev/null || die 1 "munge does not work"
say "munged up"

# 4. slurmctld (-i: ignore state files that do not match) and wait for scontrol ping UP
/usr/sbin/slurmctld -i
deadline=$(( $(date +%s) + WAIT_S ))
until out=$(scontrol ping 2>/dev/null) && [[ $out == *UP* ]]; do
    [ "$(date +%s)" -lt "$deadline" ] || { tail -20 "$STATE/log/slurmctld.log" >&2; die 1 "slurmctld not UP in ${WAIT_S}s"; }
    sleep 0.2
done
say "slurmctld UP"

# 5. slurmd and wait for the node to be idle (mixed/allocated: a job that survived a controller restart still
#    runs there; the node is up all the same). A trailing '*' (not responding) does not count.
/usr/sbin/slurmd -N "$NODE"
deadline=$(( $(date +%s) + WAIT_S ))
until [[ $(node_state) =~ ^(idle|mixed|allocated)$ ]]; do
    [ "$(date +%s)" -lt "$deadline" ] || { tail -20 "$STATE/log/slurmd.log" >&2; die 1 "node $NODE not idle in ${WAIT_S}s (state: $(node_state))"; }
    sleep 0.2
done
say "slurmd up, node $NODE $(node_state)"
