#!/usr/bin/env bash
# slurmdbd_down.sh - stop what slurmdbd_up.sh started: slurmdbd, MariaDB, and their network namespace
# ${RIG_TAG}db (every process left in it is killed). The database stays under $RIG_BASE/slurm/db.
# Idempotent; checks that nothing survives.
set -uo pipefail
source "$(dirname "$0")/common.sh"
rig_lock
S=$RIG_BASE/slurm
NS=${RIG_TAG}db
stopped=()
for f in "$S/db/slurmdbd.pid" "$S/db/mysqld.pid"; do
  pid=$(cat "$f" 2>/dev/null || true)
  if [ -n "$pid" ] && alive "$pid" && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" =~ ^(slurmdbd|mariadbd)$ ]]; then
    kill -TERM "$pid" && stopped+=("$pid")
  fi
done
[ ${#stopped[@]} -eq 0 ] || wait_gone "${stopped[@]}" || kill -KILL "${stopped[@]}" 2>/dev/null
if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$NS"; then
  left=$(ip netns pids "$NS" 2>/dev/null || true)
  [ -n "$left" ] && kill -KILL $left 2>/dev/null && wait_gone $left
  ip netns del "$NS" 2>/dev/null
fi
ip link del "${RIG_TAG}vdb" 2>/dev/null || true
rc=0
if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$NS"; then echo "ERROR: namespace $NS left" >&2; rc=1; fi
for p in "${stopped[@]}"; do alive "$p" && { echo "ERROR: $p survives" >&2; rc=1; }; done
echo "slurmdbd_down: done"
exit $rc
