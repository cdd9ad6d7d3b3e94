#!/usr/bin/env bash
# ssh_up.sh - private sshd daemons on loopback for tests (root, key-only; nothing from /etc/ssh).
#   good hosts: $SSH_ADDR:$SSH_PORTS (default 127.0.0.1: 2222 2223 2224 2225), one shared host key
#   bad host:   $SSH_ADDR:$SSH_BAD_PORT (default 2226) with ANOTHER host key than known_hosts says
# Writes under $RIG_BASE/ssh: hosts, bad_host, known_hosts, ssh_config (aliases p2222.. and badkey),
# client_key (authorized), alt_client_key (not authorized).
# Idempotent: an sshd of ours already answering on its port is left alone.
# Use: ssh -F $RIG_BASE/ssh/ssh_config p2222 hostname
set -euo pipefail
source "$(dirname "$0")/common.sh"
rig_lock
D=$RIG_BASE/ssh
PORTS=${SSH_PORTS:-2222 2223 2224 2225}
BAD_PORT=${SSH_BAD_PORT:-2226}
ADDR=${SSH_ADDR:-127.0.0.1}

need "${SSH_PKGS[@]}"
rig_keys

start_sshd() {  # port hostkey
  local port=$1 key=$2 cfg=$D/sshd_$1.conf pf=$D/sshd_$1.pid pid
  write_sshd_config "$port" "$ADDR" "$key" "$pf" > "$cfg.new"
  pid=$(cat "$pf" 2>/dev/null || true)
  if [ -n "$pid" ] && alive "$pid" && cmdline_has "$pid" "$cfg" \
     && cmp -s "$cfg" "$cfg.new" && port_open "$ADDR" "$port"; then
    rm -f "$cfg.new"; echo "sshd $ADDR:$port already up (pid $pid)"; return 0
  fi
  # ours but stale/different: stop it first
  if [ -n "$pid" ] && alive "$pid" && cmdline_has "$pid" "$cfg"; then
    kill "$pid"; wait_gone "$pid" || true
  fi
  mv "$cfg.new" "$cfg"
  if port_open "$ADDR" "$port"; then
    echo "ERROR: $ADDR:$port is taken by a process the rig did not start (set SSH_PORTS/SSH_BAD_PORT)" >&2
    return 1
  fi
  /usr/sbin/sshd -t -f "$cfg"
  /usr/sbin/sshd -f "$cfg" -E "$D/sshd_$port.log" 9>&-# daemonizes, writes the pid file
  for _ in $(seq 1 100); do port_open "$ADDR" "$port" && break; sleep 0.02; done
  port_open "$ADDR" "$port" || { echo "ERROR: sshd on $ADDR:$port did not come up" >&2; cat "$D/sshd_$port.log" >&2; return 1; }
  echo "sshd $ADDR:$port up (pid $(cat "$pf"))"
}

: > "$D/hosts.new"
for port in $PORTS; do
  start_sshd "$port" "$D/host_ed25519"
  echo "p$port $ADDR $port" >> "$D/hosts.new"
done
start_sshd "$BAD_PORT" "$D/bad_host_ed25519"
echo "badkey $ADDR $BAD_PORT" > "$D/bad_host"
mv "$D/hosts.new" "$D/hosts"
write_client_files
echo "ssh_up: ready in $(rig_ms) ms (ssh -F $D/ssh_config p${PORTS%% *} hostname)"
