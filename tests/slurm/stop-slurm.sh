#!/usr/bin/env bash
# Stop the cluster start-slurm.sh started: scancel every job while slurmctld is alive (so no slurmstepd is
# orphaned), then TERM slurmd + slurmctld together through their pid files under $RGT_SLURM_STATE, and wait
# (bounded) for them to exit; KILL what is left. munged is left running (harmless, and start-slurm.sh reuses it).
# RGT_SLURM_STOP_KILL=1 sends KILL at once. Only this cluster's jobs are cancelled (SLURM_CONF is its own
# $RGT_SLURM_STATE/slurm.conf). The state dir is kept (the next start rewrites the config and clears stale state
# with `slurmctld -i`).
set -uo pipefail

STATE=${RGT_SLURM_STATE:-/tmp/rgt-slurm}
export SLURM_CONF=$STATE/slurm.conf
T0=$(date +%s%N)
say() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf 'stop-slurm: %s (+%d.%03ds)\n' "$*" $((ms / 1000)) $((ms % 1000)); }

pid_of() { [ -s "$STATE/run/$1.pid" ] && cat "$STATE/run/$1.pid"; }
running() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

ctld=$(pid_of slurmctld || true)
slurmd=$(pid_of slurmd || true)
if running "$ctld"; then
    jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
        # shellcheck disable=SC2086
        scancel $jobs 2>/dev/null || true
        for _ in $(seq 50); do [ -z "$(squeue -h -t R,PD,CG -o %i 2>/dev/null)" ] && break; sleep 0.2; done
        say "cancelled $(echo $jobs | wc -w) job(s)"
    fi
fi

sig=TERM
[ "${RGT_SLURM_STOP_KILL:-0}" = 1 ] && sig=KILL
for pid in $slurmd $ctld; do running "$pid" && kill -s "$sig" "$pid" 2>/dev/null; done
for _ in $(seq 100); do
    running "$slurmd" || running "$ctld" || break
    sleep 0.1
done
for pid in $slurmd $ctld; do running "$pid" && { kill -KILL "$pid" 2>/dev/null; say "killed $pid"; }; done
rm -f "$STATE/run/slurmctld.pid" "$STATE/run/slurmd.pid"
say "stopped"
