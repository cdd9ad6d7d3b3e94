#!/usr/bin/env bash
# down.sh - take the whole rig down (slurm, then netns nodes, then loopback sshd) and check that
# nothing it started survives. Idempotent. Keys and logs stay under $RIG_BASE (CLEAN=1 deletes it).
set -uo pipefail
source "$(dirname "$0")/common.sh"
rig_lock
rc=0
for part in slurm netns ssh; do
  [ -f "$RIG_HERE/${part}_down.sh" ] || continue
  bash "$RIG_HERE/${part}_down.sh" || rc=1
done
rm -f "$RIG_BASE/status"
[ "${CLEAN:-0}" = 1 ] && [ $rc = 0 ] && rm -rf "$RIG_BASE"
echo "down.sh: $([ $rc = 0 ] && echo 'nothing left' || echo 'FAILED, see above') in $(rig_ms) ms"
exit $rc
