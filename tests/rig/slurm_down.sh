#!/usr/bin/env bash
# slurm_down.sh - stop the cluster started by slurm_up.sh: cancel all its jobs, `scontrol shutdown`,
# then SIGTERM/SIGKILL any slurmctld/slurmd/slurmstepd left whose environment says
# SLURM_CONF=<our conf> (in any PID namespace), then stop our munged (unless --keep-munge).
# Checks that none survive. Logs and state stay under $RIG_BASE/slurm for inspection. Idempotent.
set -uo pipefail
source "$(dirname "$0")/common.sh"
rig_lock
S=$RIG_BASE/slurm
CONF=$S/etc/slurm.conf
export SLURM_CONF=$CONF

ours() {
  local p
  for p in $(pgrep -x 'slurmctld|slurmd|slurmstepd' 2>/dev/null); do
    alive "$p" && environ_has "$p" "SLURM_CONF=$CONF" && echo "$p"
  done
  return 0
}

if [ -f "$CONF" ] && [ -n "$(ours)" ] && timeout 5 scontrol ping 2>/dev/null | grep UP >/dev/null; then
  jobs=$(timeout 10 squeue -h -o %i 2>/dev/null || true)
  if [ -n "$jobs" ]; then
    scancel $jobs 2>/dev/null
    for _ in $(seq 1 100); do [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1; done
  fi
  timeout 10 scontrol shutdown 2>/dev/null
  for _ in $(seq 1 100); do [ -z "$(ours)" ] && break; sleep 0.1; done
fi
left=$(ours)
if [ -n "$left" ]; then
  kill -TERM $left 2>/dev/null; sleep 1
  left=$(ours); [ -n "$left" ] && kill -KILL $left 2>/dev/null && sleep 0.5
fi
rc=0
left=$(ours); [ -z "$left" ] || { echo "ERROR: slurm daemons survive: $left" >&2; rc=1; }

if [ "${1:-}" != --keep-munge ]; then
  bash "$RIG_HERE/slurmdbd_down.sh" || rc=1
  pid=$(cat "$S/munge/munged.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && alive "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = munged ]; then
    kill "$pid"; wait_gone "$pid" || { echo "ERROR: munged $pid survives" >&2; rc=1; }
  fi
  rm -f "$S/munge/munge.socket.2" "$S/munge/munge.socket.2.lock"
fi
echo "slurm_down: done"
exit $rc
