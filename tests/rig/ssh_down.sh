#!/usr/bin/env bash
# ssh_down.sh - stop the loopback sshd daemons started by ssh_up.sh (by pid file, and only if the
# process really is an sshd running our config). Keys and client files are kept (netns nodes use
# them too); CLEAN=1 also deletes $RIG_BASE/ssh. Idempotent.
set -uo pipefail
source "$(dirname "$0")/common.sh"
rig_lock
D=$RIG_BASE/ssh
pids=()
for pf in "$D"/sshd_*.pid; do
  [ -f "$pf" ] || continue
  pid=$(cat "$pf"); conf=${pf%.pid}.conf
  if alive "$pid" && cmdline_has "$pid" "$conf"; then
    kill "$pid" && pids+=("$pid") && echo "stopped sshd pid $pid ($conf)"
  fi
  rm -f "$pf"
done
# Sessions still open keep per-connection sshd children alive: they were started by our listener,
# so their cmdline names our config too.
for p in $(pgrep -x sshd 2>/dev/null); do
  cmdline_has "$p" "$D/sshd_" && kill "$p" 2>/dev/null && pids+=("$p")
done
[ ${#pids[@]} -gt 0 ] && { wait_gone "${pids[@]}" || { kill -KILL "${pids[@]}" 2>/dev/null; wait_gone "${pids[@]}"; }; }
rm -f "$D/hosts" "$D/bad_host"
write_client_files
[ "${CLEAN:-0}" = 1 ] && rm -rf "$D"
left=$(for p in $(pgrep -x sshd 2>/dev/null); do cmdline_has "$p" "$D/sshd_" && echo "$p"; done)
[ -z "$left" ] || { echo "ERROR: rig sshd still alive: $left" >&2; exit 1; }
echo "ssh_down: done"
exit 0
