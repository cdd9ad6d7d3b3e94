#!/usr/bin/env bash
# up.sh - bring the whole test rig up (or only the parts named): ssh netns slurm.
#   bash tests/rig/up.sh              # everything
#   bash tests/rig/up.sh ssh          # loopback sshd only
# slurm needs netns (its slurmd run inside the nodes), so naming slurm brings netns up too.
# Idempotent and quick when already up. Writes $RIG_BASE/status ("part ok|fail") and exits 1 when a
# part failed (the others are still brought up). Env: see each part's script (RIG_BASE, RIG_TAG,
# SSH_PORTS, SSH_BAD_PORT, NODES, NET_PREFIX, SLURMCTLD_PORT, SLURMD_PORT, SLURM_CPUS, SLURM_GPUS).
set -uo pipefail
source "$(dirname "$0")/common.sh"
rig_lock
parts=("$@"); [ ${#parts[@]} -gt 0 ] || parts=(ssh netns slurm)
want() { local p; for p in "${parts[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }
want slurm && ! want netns && parts=(netns "${parts[@]}")
# everything missing in one apt-get run (each part script checks its own again), plus gdb (and lldb, which
# mldebug attach injects with where gdb cannot: docs/commands/attach.md) for the
# stack tests that use the rig, Prometheus (prometheus, promtool) for the exporter's tests, and Chromium with
# its driver for the HTML pages' browser tests (about 20-45 s more on a fresh machine), and the lz4 tool, whose
# files `mldebug logs` reads
need "${SSH_PKGS[@]}" "${NETNS_PKGS[@]}" gdb:gdb lldb-19:lldb-19 strace:strace lz4:lz4 "${PROM_PKGS[@]}" "${BROWSER_PKGS[@]}" \
  $(want slurm && echo "${SLURM_PKGS[@]}" "${SLURMDBD_PKGS[@]}") \
  || echo "WARNING: some packages did not install; the parts that need them will fail" >&2
rc=0
touch "$RIG_BASE/status"
for part in ssh netns slurm; do
  want "$part" || continue
  if bash "$RIG_HERE/${part}_up.sh"; then st=ok; else st=fail; rc=1; fi
  { grep -v "^$part " "$RIG_BASE/status"; echo "$part $st"; } > "$RIG_BASE/status.new"
  mv "$RIG_BASE/status.new" "$RIG_BASE/status"
  echo "== $part: $st"
done
echo "up.sh: $(tr '\n' ' ' < "$RIG_BASE/status")in $(rig_ms) ms"
exit $rc
