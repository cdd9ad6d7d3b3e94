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
# venv writes bin/activate last (after pip): without it, a venv interrupted while it was made is made again.
if [ ! -x .venv/bin/python ] || [ ! -f .venv/bin/activate ]; then
  # Debian and Ubuntu ship venv's pip bootstrap (ensurepip) in a separate package.
  python3 -c 'import ensurepip' 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv; }
  python3 -m venv --clear .venv
fi
# On Linux, PyPI's torch wheel is the CUDA build (GBs of NVIDIA libraries). When the index pip uses
# would bring those (its dry-run plan lists nvidia-* packages) and PyTorch's CPU index answers within
# 5 s, torch comes from there first (MLDEBUG_TORCH_INDEX= never, or names another index). An
# unreachable index is never handed to pip: pip retries each project page 5 times on it.
TORCH_INDEX=${MLDEBUG_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
: > .venv/pip.log
if [ -n "$TORCH_INDEX" ] \
   && ! .venv/bin/python -c 'import importlib.metadata as m, sys; sys.exit(m.version("torch").split("+")[0] != "2.13.0")' 2>/dev/null \
   && .venv/bin/pip install -q --disable-pip-version-check --dry-run --report .venv/torch-plan.json torch==2.13.0 >> .venv/pip.log 2>&1 \
   && grep -q '"name": "nvidia-' .venv/torch-plan.json \
   && timeout 10 .venv/bin/python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5)' "$TORCH_INDEX" 2>/dev/null; then
  echo "tests/run.sh: torch from $TORCH_INDEX"
  .venv/bin/pip install -q --disable-pip-version-check torch==2.13.0 --index-url "$TORCH_INDEX" >> .venv/pip.log 2>&1 \
    || echo "tests/run.sh: torch from $TORCH_INDEX failed (.venv/pip.log); using the default index" >&2
fi
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0 -e '.[test]' >> .venv/pip.log 2>&1 \
  || { tail -n 30 .venv/pip.log; echo "tests/run.sh: pip install failed" >&2; exit 1; }
export PATH="$PWD/.venv/bin:$PATH"
# 2. Debian packages of the rig (openssh, Slurm, munge, slurmdbd and MariaDB, gdb, iproute2, prometheus, systemd-analyze), and the rig
#    itself up.
bash tests/rig/up.sh
# 2b. A Python 3.12+ with CPython's test package, for NicerTrace's sys.monitoring backend. Only PyPI
# and Debian's archive are reachable here, and neither ships one for Debian 12 (pyenv and uv would
# download it): use pyenv's interpreters, which machines of this kind carry, or one on PATH, or
# Debian's python3.12/3.13 where the release has it (Debian 13, Ubuntu 24.04).
py312_ok() { "$1" -c 'import sys, test.test_trace; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; }
find_py312() {
  local exe
  for exe in ${MLDEBUG_PYTHON312:-} $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -rV) \
             $(command -v python3.14 python3.13 python3.12 2>/dev/null); do
    py312_ok "$exe" && { echo "$exe"; return 0; }
  done
  return 1
}
if ! MLDEBUG_PYTHON312=$(find_py312); then
  for v in 3.13 3.12; do
    if [ -n "$(apt-cache policy "python$v" 2>/dev/null | awk '/Candidate:/ && $2 != "(none)"')" ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q "python$v" "libpython$v-testsuite" > .venv/apt-python.log 2>&1 || true
      break
    fi
  done
  MLDEBUG_PYTHON312=$(find_py312) || MLDEBUG_PYTHON312=
fi
if [ -n "$MLDEBUG_PYTHON312" ]; then
  export MLDEBUG_PYTHON312
  echo "tests/run.sh: Python 3.12+ for sys.monitoring: $MLDEBUG_PYTHON312"
else
  echo "tests/run.sh: ERROR: no Python 3.12+ with CPython's test package (pyenv, PATH, apt): the sys.monitoring" \
       "test will FAIL; set MLDEBUG_PYTHON312=/path/to/python3.12 to name one" >&2
fi
echo "tests/run.sh: installed in $(( $(date +%s) - t0 )) s"

# 3. Lint, then the whole suite; real parts are required.
.venv/bin/ruff check --quiet . || { echo "tests/run.sh: ruff found problems" >&2; exit 1; }
# The layers point down and the user-imported modules stay dependency-free (pyproject.toml).
.venv/bin/lint-imports --no-cache > .venv/lint-imports.log 2>&1 \
  || { cat .venv/lint-imports.log; echo "tests/run.sh: an import breaks the layers" >&2; exit 1; }
.venv/bin/mypy ml_debug || { echo "tests/run.sh: mypy found type errors" >&2; exit 1; }
export MLDEBUG_REQUIRE_REAL=1 OMP_NUM_THREADS=1
# Bytecode caches on, whatever the image says (container images often set PYTHONDONTWRITEBYTECODE=1):
# without them every pytest process (each xdist worker, then the serial part) rewrites the asserts of all
# test modules again (collection: 10.9 against 5.3 CPU s per process, measured here). Compiled once here,
# before the workers start.
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m compileall -q -j 0 ml_debug tests > /dev/null
set +e
# Three pytest-xdist workers on 2 cores: many tests wait on real jobs, sshd and Slurm, and a third worker
# fills those waits (measured on a clean clone: 722 s against 775 s with two). Tests marked
# `serial` judge CPU shares or rates, which a second worker's ranks would skew on 2 cores: they run
# alone afterwards.
# MLDEBUG_TEST_WORKERS=0 runs everything in one process.
workers=${MLDEBUG_TEST_WORKERS:-3}
if [ "$workers" = 0 ]; then
  .venv/bin/python -m pytest -p no:cacheprovider --durations=25 "$@"
  rc=$?
else
  .venv/bin/python -m pytest -p no:cacheprovider --durations=25 -n "$workers" --dist load --maxschedchunk 2 -m "not serial" "$@"
  rc=$?
  .venv/bin/python -m pytest -p no:cacheprovider --durations=10 -m serial "$@"
  rc2=$?
  # pytest's 5 is "no test selected" (`-k printflock` selects none of the serial ones): a failure only
  # when neither part selected anything
  ok() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; }
  if ! ok $rc; then :; elif ! ok $rc2; then rc=$rc2; elif [ $rc -eq 5 ] && [ $rc2 -eq 5 ]; then rc=5; else rc=0; fi
fi
set -e
[ "${MLDEBUG_RIG_TEARDOWN:-0}" = 1 ] && bash tests/rig/down.sh
echo "tests/run.sh: done in $(( $(date +%s) - t0 )) s (pytest rc=$rc)"
exit $rc
