#!/usr/bin/env bash
# netns_down.sh - remove what netns_up.sh created: kill (SIGKILL) the processes inside our own
# ${RIG_TAG}n<i> namespaces (node init, sshd, anything started in a node), delete the namespaces, the
# veths and the bridge; then check that no process is left in them. Idempotent.
set -uo pipefail
source "$(dirname "$0")/common.sh"
rig_lock
DIR=$RIG_BASE/netns
BR=${RIG_TAG}br0
killed=()
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${RIG_TAG}n[0-9]+\$"); do
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  # also whatever lives in a node's PID namespace without being in its network namespace
  for p in $pids; do
    if grep -qP '^NSpid:\t\d+\t1$' "/proc/$p/status" 2>/dev/null; then
      pidns=$(stat -L -c %i "/proc/$p/ns/pid")
      pids+=" $(stat -L -c '%i %n' /proc/[0-9]*/ns/pid 2>/dev/null | awk -v i="$pidns" '$1 == i {split($2, a, "/"); printf "%s ", a[3]}')"
    fi
  done
  pids=$(echo $pids | tr ' ' '\n' | sort -u)
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null && killed+=($pids)
  ip link del "${RIG_TAG}v${ns#${RIG_TAG}n}" 2>/dev/null
  ip netns del "$ns" 2>/dev/null
  echo "removed $ns"
done
for v in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^${RIG_TAG}v[0-9]+\$"); do
  ip link del "$v" 2>/dev/null
done
ip link del "$BR" 2>/dev/null && echo "removed $BR"
rm -f "$DIR"/*.init.pid "$DIR"/nodes "$DIR"/sshd_*.pid
write_client_files
rc=0
if [ ${#killed[@]} -gt 0 ] && ! wait_gone "${killed[@]}"; then
  echo "ERROR: processes of the netns nodes survive SIGKILL:" >&2; ps -o pid,stat,args -p "${killed[*]// /,}" >&2; rc=1
fi
[ -z "$(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${RIG_TAG}n[0-9]+\$")" ] || { echo "ERROR: namespaces left" >&2; rc=1; }
echo "netns_down: done"
exit $rc
