#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian machine of this kind and run the whole suite
# with real parts required (a missing sshd, Slurm, py-spy or gdb FAILS the run instead of skipping).
#
#   bash tests/run.sh            # everything
#   bash tests/run.sh -k printflock -x   # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)

# 1. Python: a venv with pinned CPU torch (an open range could pull a multi-GB CUDA build).
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0 -e '.[test]' > .venv/pip.log 2>&1 \
  || { tail -n 30 .venv/pip.log; echo "tests/run.sh: pip install failed" >&2; exit 1; }
export PATH="$PWD/.venv/bin:$PATH"
# 2. Debian packages of the rig (openssh, Slurm, munge, gdb, iproute2), and the rig itself up.
bash tests/rig/up.sh
echo "tests/run.sh: installed in $(( $(date +%s) - t0 )) s"

# 3. Lint, then the whole suite; real parts are required.
.venv/bin/ruff check --quiet . || { echo "tests/run.sh: ruff found problems" >&2; exit 1; }
export MLDEBUG_REQUIRE_REAL=1 OMP_NUM_THREADS=1
set +e
.venv/bin/python -m pytest -p no:cacheprovider --durations=25 "$@"
rc=$?
set -e
[ "${MLDEBUG_RIG_TEARDOWN:-0}" = 1 ] && bash tests/rig/down.sh
echo "tests/run.sh: done in $(( $(date +%s) - t0 )) s (pytest rc=$rc)"
exit $rc
