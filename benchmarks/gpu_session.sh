#!/usr/bin/env bash
# One prepared GPU session: install what can be installed, run every GPU benchmark and every
# gpu-marked test, each under its own timeout, and write a report into $OUT (default ./gpu-report):
#   report.md    every figure with its command, each install attempt, each step, each test's outcome
#   report.json  the same, machine-readable (schema mldebug.gpu-session)
#   logs.txt     the last lines of every step's output
#   pytest.xml   pytest's JUnit report
# The whole run stays under MLDEBUG_GPU_BUDGET_S seconds (default 520, under 9 minutes).
#
#   bash benchmarks/gpu_session.sh                  # on the GPU machine, from anywhere in the repo
#   OUT=/tmp/r bash benchmarks/gpu_session.sh       # report elsewhere
#   MLDEBUG_GPU_ONLY=tests bash benchmarks/gpu_session.sh   # or =bench: one half only
#   bash benchmarks/gpu_session.sh --fetch-wheels   # on a machine WITH PyPI, beforehand: downloads the
#                                                   # wheels a bare GPU image lacks into .whl/ (carry it;
#                                                   # TORCHAO_VERSION=... picks the torchao for its torch)
#
# Environment: PYTHON (default python3: on the lent GPU machines, the one that holds a CUDA torch);
# MLDEBUG_GPU_NO_INSTALL=1 skips the install attempts (a machine already set up, or a dry run).
# Nothing here needs the network: it tries to install, says what failed, and goes on with what works
# (the repository is put on PYTHONPATH, so mldebug runs uninstalled).
set -u -o pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}

if [ "${1:-}" = "--fetch-wheels" ]; then
  # Wheels for CPython 3.12 on x86-64 Linux (the GPU image's Python), at the versions this machine's
  # environment has where it has them. torch is not among them: the GPU image has a CUDA build.
  mkdir -p .whl
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude 2>/dev/null || true
  fetch_py=${FETCH_PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo "$PY")}
  rc=0
  for name in paramiko bcrypt cryptography PyNaCl cffi pycparser invoke py-spy jsonschema \
              jsonschema-specifications referencing rpds-py hyperscan prometheus_client torchao; do
    ver=$("$fetch_py" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$name" 2>/dev/null)
    [ "$name" = torchao ] && ver=${TORCHAO_VERSION:-$ver}  # torchao releases follow torch's: pick one to match
    spec=$name${ver:+==$ver}
    if ! "$fetch_py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
         --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
         --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
         --platform manylinux1_x86_64 -d .whl "$spec"; then
      echo "gpu_session.sh: could not download $spec" >&2; rc=1
    fi
  done
  du -sh .whl; ls .whl
  echo "gpu_session.sh: carry .whl with the run (carry: [\".whl\"]); the session installs it first"
  exit $rc
fi

OUT=${OUT:-$REPO/gpu-report}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUDGET=${MLDEBUG_GPU_BUDGET_S:-520}
ONLY=${MLDEBUG_GPU_ONLY:-all}
WORK=$(mktemp -d /tmp/mldebug-gpu-session.XXXXXX)
START=$(date +%s)
SESSION="gpu-session-$$-$START"
export MLDEBUG_GPU_SESSION=$SESSION   # every process a step starts carries it: leftovers are found by it
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export MLDEBUG_WIDTH=160
: > "$WORK/steps.tsv"
: > "$WORK/install.tsv"

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
say() { echo "[gpu-session $(( $(date +%s) - START ))s] $*"; }

# record FILE NAME RC SECONDS LIMIT NOTE COMMAND...
record() {
  local file=$1 name=$2 rc=$3 secs=$4 limit=$5 note=$6; shift 6
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$secs" "$limit" "$*" "$note" >> "$file"
}

# step NAME LIMIT_SECONDS RESERVE_SECONDS COMMAND...: run it under min(LIMIT, time left - RESERVE);
# an argument {BUDGET} becomes that limit less 10 s (the benchmarks stop starting new parts then).
# SIGINT first (pytest and the benchmarks write what they have), SIGKILL 15 s later; then stop
# whatever it left running (torchrun's ranks live in their own sessions, out of timeout's reach).
step() {
  local name=$1 limit=$2 reserve=$3; shift 3
  local avail=$(( $(left) - reserve ))
  local t=$(( limit < avail ? limit : avail ))
  local args=() a
  for a in "$@"; do args+=("${a//\{BUDGET\}/$(( t - 10 ))}"); done
  if [ "$t" -lt 20 ]; then
    say "skip $name: $(left) s left"
    record "$WORK/steps.tsv" "$name" skipped 0 "$limit" "no time left in the budget" "${args[@]}"
    return
  fi
  say "run $name (limit ${t}s): ${args[*]}"
  local t0; t0=$(date +%s)
  timeout -s INT -k 15 "$t" "${args[@]}" > "$WORK/$name.log" 2>&1
  local rc=$?
  record "$WORK/steps.tsv" "$name" "$rc" $(( $(date +%s) - t0 )) "$t" "" "${args[@]}"
  say "$name: exit $rc after $(( $(date +%s) - t0 ))s"
  timeout 30 "$PY" benchmarks/gpu_session_report.py reap "$SESSION" >> "$WORK/$name.log" 2>&1
}

# attempt NAME LIMIT COMMAND...: one install try, recorded whatever its outcome
attempt() {
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  local note; note=$(grep -E 'ERROR|error:|No matching|Could not|Successfully installed' "$WORK/$name.log" | tail -n 2 | tr '\n\t' '  ')
  record "$WORK/install.tsv" "$name" "$rc" $(( $(date +%s) - t0 )) "$limit" "${note:0:300}" "$@"
  say "install $name: exit $rc"
  return $rc
}

# ---- 1. install (offline-safe: fails fast, never stops the session) -------------------------------
PIPQ=(-m pip install --retries 0 --timeout 5 --no-build-isolation)
FIND=()
if [ "${MLDEBUG_GPU_NO_INSTALL:-0}" = 1 ]; then
  record "$WORK/install.tsv" install skipped 0 0 "MLDEBUG_GPU_NO_INSTALL=1" "(none)"
else
  if [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1; then
    FIND=(--find-links .whl)
    attempt wheels 60 "$PY" -m pip install -q --no-index --no-deps --no-compile .whl/*.whl
  fi
  if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' > /dev/null 2>&1; then
    record "$WORK/install.tsv" torch 0 0 0 \
      "kept the installed CUDA torch $("$PY" -c 'import torch; print(torch.__version__)')" "(not reinstalled)"
    attempt project 45 "$PY" "${PIPQ[@]}" ${FIND[@]+"${FIND[@]}"} -e '.[test]' \
      || attempt project-nodeps 45 "$PY" "${PIPQ[@]}" --no-deps -e .
  else
    attempt project-with-torch 60 "$PY" "${PIPQ[@]}" ${FIND[@]+"${FIND[@]}"} torch==2.13.0 -e '.[test]' \
      || attempt project-nodeps 45 "$PY" "${PIPQ[@]}" --no-deps -e .
  fi
fi
timeout -k 5 90 "$PY" benchmarks/gpu_session_report.py probe "$WORK/probe.json" > "$WORK/probe.log" 2>&1
record "$WORK/install.tsv" probe $? 0 90 "see report.md's header" "$PY benchmarks/gpu_session_report.py probe"
timeout -k 5 30 nvidia-smi > "$WORK/nvidia-smi.log" 2>&1
record "$WORK/install.tsv" nvidia-smi $? 0 30 "" nvidia-smi

# ---- 2. every gpu-marked test, real parts required (a missing py-spy or torchao fails, by name) ---
# First: a test cannot stop halfway and still say something, the benchmarks can (they skip what does
# not fit their budget and say so). 200 s stay for the benchmarks and the report (20 s with the tests alone).
if [ "$ONLY" != bench ]; then
  # tests/gpu/test_fr_nccl_files.py leaves its real NCCL Flight Recorder dump in $OUT/fr-nccl (CPU tests read it)
  step pytest-gpu 330 "$([ "$ONLY" = tests ] && echo 20 || echo 200)" env MLDEBUG_REQUIRE_REAL=1 OMP_NUM_THREADS=1 MLDEBUG_GPU_KEEP="$OUT/fr-nccl" \
    "$PY" -m pytest -m gpu tests/ \
    -p no:cacheprovider --continue-on-collection-errors -rA --durations=20 --junitxml="$WORK/pytest.xml"
fi

# ---- 3. benchmarks (each writes its figures, with their commands, as JSON) ------------------------
# Most wanted first (the 1b bf16 MFU); each reserve keeps time for the ones after it and the report.
if [ "$ONLY" != tests ]; then
  # with the tests left out, the train runs may take every run of gpu_train_mfu.py (fp8, MX, 1b)
  step bench-train-mfu "$([ "$ONLY" = bench ] && echo 300 || echo 100)" 125 \
    "$PY" benchmarks/gpu_train_mfu.py --budget-s '{BUDGET}' --out "$WORK/bench-train-mfu.json"
  step bench-health-stress 65 65 "$PY" benchmarks/gpu_health_stress.py --budget-s '{BUDGET}' \
    --out "$WORK/bench-health-stress.json"
  step bench-allreduce 55 35 "$PY" benchmarks/gpu_allreduce.py --budget-s '{BUDGET}' \
    --out "$WORK/bench-allreduce.json"
  step bench-nvidia-smi 40 15 "$PY" benchmarks/gpu_compare_nvidia_smi.py --level 1 --timeout '{BUDGET}' \
    --out "$WORK/bench-nvidia-smi.json"
fi

# ---- 4. the report ----------------------------------------------------------------------------------
"$PY" benchmarks/gpu_session_report.py report "$WORK" "$OUT" || say "report: exit $?"
[ -f "$WORK/pytest.xml" ] && cp "$WORK/pytest.xml" "$OUT/pytest.xml"
say "done in $(( $(date +%s) - START ))s: $OUT/report.md"
[ -f "$OUT/report.md" ] && cat "$OUT/report.md"
rm -rf "$WORK"
