#!/usr/bin/env bash
# netns_up.sh - simulate $NODES cluster nodes (default 3) on this host, as root, without Docker.
# Node i (node1..nodeN):
#   * network namespace ${RIG_TAG}n<i> with eth0 = $NET_PREFIX.<10+i>/24 (default 10.213.7.x): a veth
#     whose other end ${RIG_TAG}v<i> sits on bridge ${RIG_TAG}br0 = $NET_PREFIX.1/24 here. No default
#     route, ip_forward untouched: traffic flows only between the nodes and this host.
#   * its own hostname (UTS ns), PID namespace and mount namespace with a private /proc, so `ps` in a
#     node shows only that node's processes. PID 1 is a small bash loop that reaps orphans; its pid
#     here is in $RIG_BASE/netns/node<i>.init.pid. Enter a node with
#       nsenter -t <init pid> -n -p -m -u -- CMD...
#   * an sshd on <ip>:22 with the rig's host key and authorized_keys (see ssh_up.sh).
# Writes $RIG_BASE/netns/nodes ("name ip init_pid") and adds the nodes to ssh/known_hosts and
# ssh/ssh_config. Idempotent: a node whose sshd answers is left alone; a half-built one is rebuilt.
# (nsenter --net, not `ip netns exec`: the latter remounts /sys, hiding /sys/fs/cgroup from slurmd.)
set -euo pipefail
source "$(dirname "$0")/common.sh"
rig_lock
N=${NODES:-3}
PFX=${NET_PREFIX:-10.213.7}
BR=${RIG_TAG}br0
DIR=$RIG_BASE/netns

need "${SSH_PKGS[@]}" "${NETNS_PKGS[@]}"
mkdir -p "$DIR"
rig_keys

ip link show "$BR" >/dev/null 2>&1 || ip link add "$BR" type bridge
ip -4 addr show dev "$BR" | grep "inet $PFX.1/24" >/dev/null || ip addr add "$PFX.1/24" dev "$BR"
ip link set "$BR" up

node_init_pid() {  # pid (here) of the process that is PID 1 in the node's PID namespace
  local p
  for p in $(ip netns pids "$1" 2>/dev/null); do
    grep -qP '^NSpid:\t\d+\t1$' "/proc/$p/status" 2>/dev/null && { echo "$p"; return 0; }
  done
  return 1
}

: > "$DIR/nodes.new"
for i in $(seq 1 "$N"); do
  name=node$i ns=${RIG_TAG}n$i veth=${RIG_TAG}v$i ip=$PFX.$((10 + i))
  init=$(node_init_pid "$ns" || true)
  if [ -n "$init" ] && [ "$(nsenter -t "$init" -u hostname 2>/dev/null)" = "$name" ] && port_open "$ip" 22; then
    echo "$name: already up (ip $ip, init pid $init)"
  else
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip link del "$veth" 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    ip netns add "$ns"
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    ip link set "$veth" master "$BR"
    ip link set "$veth" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$ip/24" dev eth0
    ip -n "$ns" link set eth0 up
    setsid -f nsenter --net="/run/netns/$ns" -- unshare --uts --pid --fork --mount-proc --kill-child \
      bash -c "hostname $name; trap 'exit 0' TERM; while :; do sleep 3600 & wait \$!; done" \
      </dev/null >"$DIR/$name.init.log" 2>&1 9>&-
    init=""
    for _ in $(seq 1 100); do init=$(node_init_pid "$ns" || true); [ -n "$init" ] && break; sleep 0.05; done
    [ -n "$init" ] || { echo "ERROR: init of $name did not start" >&2; cat "$DIR/$name.init.log" >&2; exit 1; }
    write_sshd_config 22 "$ip" "$RIG_BASE/ssh/host_ed25519" "$DIR/sshd_$name.pid" > "$DIR/sshd_$name.conf"
    # sshd daemonizes; inside the node it is re-parented to the node's PID 1
    nsenter -t "$init" -n -p -m -u -- /usr/sbin/sshd -f "$DIR/sshd_$name.conf" -E "$DIR/sshd_$name.log" 9>&-
    for _ in $(seq 1 100); do port_open "$ip" 22 && break; sleep 0.05; done
    port_open "$ip" 22 || { echo "ERROR: sshd of $name not reachable at $ip:22" >&2; cat "$DIR/sshd_$name.log" >&2; exit 1; }
    echo "$name: up (ip $ip, init pid $init)"
  fi
  echo "$init" > "$DIR/$name.init.pid"
  echo "$name $ip $init" >> "$DIR/nodes.new"
done
mv "$DIR/nodes.new" "$DIR/nodes"
write_client_files
echo "netns_up: $N nodes ready in $(rig_ms) ms (ssh -F $RIG_BASE/ssh/ssh_config node1 hostname)"
