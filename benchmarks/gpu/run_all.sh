#!/bin/bash
# Run on the GPU machine, from the repository root, as one command:
#
#   bash benchmarks/gpu/run_all.sh
#
# Stages, each under its own timeout, each run even when an earlier one failed (except
# where it cannot: no build without a configure):
#   prepare    benchmarks/gpu/prepare.sh (unpacks the carried .debs, writes env.sh)
#   configure  cmake -S . -B build-gpu -DGPTC_CUDA=ON -DGPTC_NCCL_ROOT=... + env.sh's hints
#   build      cmake --build build-gpu
#   precheck   benchmarks/gpu/check_staged.sh (GPTC_GPU_PRECHECK names another; empty: none)
#   ctest_gpu  ctest -L gpu (the GPU-labelled tests)
#   ctest_sanitizer  ctest -L sanitizer (compute-sanitizer memcheck, racecheck and synccheck)
#   bench_*    every benchmarks/gpu/bench_*.sh and bench_*.py: those GPTC_GPU_BENCH_ORDER
#              names first, in its order (default: bench_gpt2 bench_kernel_attention
#              bench_contention bench_ncu_attention, what issue 5 asks first), then the
#              rest in name order
#   torch_smoke  torch_gpt2.py, a few bf16 steps (GPTC_GPU_TORCH_SMOKE=1; bench_gpt2 already
#              runs the PyTorch peer, so it is off by default)
# Everything it produces lands in ${GPTC_GPU_RESULTS:-gpu-results}/: one log per stage, the
# prepare summary, env.sh, CMake's cache and ctest's log, and summary.txt (always written:
# the machine, then one line per stage: PASS, FAIL, TIMEOUT or SKIPPED, with the reason).
# Where $OUT is set (the device tool, which returns at most 8 files), that folder is packed
# into $OUT/gpu-results.tgz after every stage, and summary.txt is copied beside it.
#
# Time: the whole run keeps within GPTC_GPU_BUDGET_S (default 540 s). A stage starts only
# if the budget has its minimum left, and its timeout is cut to what remains.
# Environment: GPTC_GPU_BUDGET_S, GPTC_GPU_PREFIX (see prepare.sh), GPTC_GPU_BUILD,
# (default build-gpu), GPTC_GPU_SANITIZER=0 (no compute-sanitizer stage: the GPU tests,
# then the benchmarks), GPTC_GPU_SANITIZER_REGEX (ctest -R of that stage: e.g.
# '^test_cuda_ops_(memcheck|racecheck|synccheck)$' leaves out the per-variant racechecks of
# attention kernels a change did not touch), GPTC_GPU_CTEST_TIMEOUT_S (per GPU test,
# default 240), GPTC_GPU_CMAKE_EXTRA (more cmake -D flags), GPTC_GPU_TORCH_SMOKE,
# GPTC_GPU_BENCH_TIMEOUT_S (per benchmark, default 180), GPTC_GPU_BENCH_DIR (tests only).
# A benchmark finds the build in $GPTC_BUILD and writes its results under $GPTC_BENCH_OUT.
set -u

START=$(date +%s)
BUDGET=${GPTC_GPU_BUDGET_S:-540}
RESERVE=10                          # kept back for copying logs and the summary
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
cd "$REPO" || exit 1
RES=${GPTC_GPU_RESULTS:-gpu-results}
mkdir -p "$RES" || { echo "run_all: cannot create $RES" >&2; exit 1; }
RES=$(cd "$RES" && pwd)
BUILD=$(realpath -m "${GPTC_GPU_BUILD:-build-gpu}")
BENCH_DIR=${GPTC_GPU_BENCH_DIR:-$HERE}
export GPTC_GPU_PREFIX=${GPTC_GPU_PREFIX:-$REPO/.gpu-prefix}
SUM=$RES/summary.txt
NFAIL=0

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET - $(elapsed) - RESERVE )); }
note() { echo "$*" | tee -a "$SUM"; }
# after every stage, so that a run killed from outside still returns what it got
pack() {
  [ -n "${OUT:-}" ] || return 0
  tar -czf "$OUT/gpu-results.tgz" -C "$(dirname "$RES")" "$(basename "$RES")" 2>/dev/null
  cp "$SUM" "$OUT/summary.txt" 2>/dev/null
  return 0
}

# What ran: the git tree of the working copy (its files that git does not ignore), which
# `git log --format='%h %T'` on the machine that sent it names a commit of. The device tool
# copies the working tree, but the copy's .git can hold an older HEAD (2026-11-27: the
# session's first commit, under two later trees).
tree_of() {
  local idx; idx=$(mktemp -u)
  (cd "$REPO" && GIT_INDEX_FILE=$idx git add -A . >/dev/null 2>&1 &&
    GIT_INDEX_FILE=$idx git write-tree 2>/dev/null) || echo "unknown"
  rm -f "$idx"
}

# The summary is rewritten at the end, but stage lines are appended as they finish, so a
# run killed from outside still leaves what it got.
{
  echo "gptc GPU run: $(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${BUDGET} s"
  echo "repo: $REPO (HEAD $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo 'no git'), working tree $(tree_of))"
  echo
} > "$SUM"

# stage NAME MIN_S TIMEOUT_S COMMAND...: runs COMMAND (its output in NAME.log) unless
# fewer than MIN_S seconds of budget are left; records the outcome; returns its status.
STAGE_RC=0
stage() {
  local name=$1 min=$2 tmo=$3; shift 3
  local l; l=$(left)
  if [ "$l" -lt "$min" ]; then
    note "$(printf '%-14s SKIPPED   budget: %s s left, stage needs %s s' "$name" "$l" "$min")"
    STAGE_RC=125; return 125
  fi
  [ "$tmo" -gt "$l" ] && tmo=$l
  local t0; t0=$(date +%s)
  echo "run_all: [$name] up to ${tmo} s: $*"
  # -k: a stage that ignores SIGTERM (a hung mpirun) is killed 5 s later
  timeout -k 5 "$tmo" "$@" > "$RES/$name.log" 2>&1
  local rc=$? dt=$(( $(date +%s) - t0 )) verdict
  case $rc in
    0) verdict=PASS ;;
    124|137) verdict=TIMEOUT; NFAIL=$((NFAIL + 1)) ;;
    *) verdict=FAIL; NFAIL=$((NFAIL + 1)) ;;
  esac
  note "$(printf '%-14s %-9s %4d s  (exit %d, timeout %d s, log %s.log)' "$name" "$verdict" "$dt" "$rc" "$tmo" "$name")"
  if [ "$verdict" != PASS ]; then tail -5 "$RES/$name.log" | sed 's/^/    | /' | tee -a "$SUM"; fi
  pack
  STAGE_RC=$rc; return $rc
}
skip() { note "$(printf '%-14s SKIPPED   %s' "$1" "$2")"; }

# ------------------------------------------------------------------------ prepare
stage prepare 20 150 bash "$HERE/prepare.sh"
ENV_SH=$GPTC_GPU_PREFIX/env.sh
if [ -f "$ENV_SH" ]; then
  # shellcheck disable=SC1090
  . "$ENV_SH"
  cp "$ENV_SH" "$RES/env.sh"
else
  note "no env.sh: configuring with whatever the system has"
fi
[ -f "$GPTC_GPU_PREFIX/prepare-summary.txt" ] && cp "$GPTC_GPU_PREFIX/prepare-summary.txt" "$RES/"
nvidia-smi > "$RES/nvidia-smi.txt" 2>&1

# ------------------------------------------------------------------------ configure, build
CONF_ARGS=(-S . -B "$BUILD" -DGPTC_CUDA=ON -DCMAKE_BUILD_TYPE=Release)
# the tests need numpy and h5py: the GPU image has them in the python3 on PATH (a venv)
command -v python3 >/dev/null && CONF_ARGS+=("-DGPTC_PYTHON=$(command -v python3)")
[ -n "${GPTC_NCCL_ROOT:-}" ] && CONF_ARGS+=("-DGPTC_NCCL_ROOT=$GPTC_NCCL_ROOT")
# shellcheck disable=SC2206  # lists of -D flags, split on spaces on purpose
CONF_ARGS+=(${GPTC_CMAKE_ARGS:-} ${GPTC_GPU_CMAKE_EXTRA:-})
if ! command -v cmake >/dev/null; then
  skip configure "no cmake on this machine (fetch_debs.sh with GPTC_DEBS_EXTRA=cmake carries one)"
  CONF_OK=0
else
  stage configure 30 150 cmake "${CONF_ARGS[@]}"; CONF_OK=$(( STAGE_RC == 0 ))
fi
cp "$BUILD/CMakeCache.txt" "$RES/" 2>/dev/null
for f in "$BUILD"/CMakeFiles/CMakeConfigureLog.yaml "$BUILD"/CMakeFiles/CMakeError.log; do
  [ "$CONF_OK" = 0 ] && [ -f "$f" ] && cp "$f" "$RES/"
done

BUILD_OK=0
if [ "$CONF_OK" = 1 ]; then
  stage build 60 300 cmake --build "$BUILD" -j "$(nproc)"; BUILD_OK=$(( STAGE_RC == 0 ))
else
  skip build "configure did not succeed"
fi

# ------------------------------------------------------------------------ precheck
# A short check run first (check_staged.sh: the layouts that once hung); when it fails,
# the tests and benchmarks are skipped (a hang would only spend the budget on timeouts).
ONLY=${GPTC_GPU_ONLY:-all}
PRECHECK=${GPTC_GPU_PRECHECK-$HERE/check_staged.sh}
if [ "$BUILD_OK" = 1 ] && [ -n "$PRECHECK" ]; then
  GPTC_BUILD=$BUILD stage precheck 30 150 bash "$PRECHECK"
  [ "$STAGE_RC" = 0 ] || { ONLY=none; cat "$RES/precheck.log"; }
fi

# ------------------------------------------------------------------------ GPU tests
# GPTC_GPU_ONLY=tests runs the tests and no benchmarks, =bench the benchmarks and no tests
# (to split the work over two device calls; the build is reused while the machine is warm)
if [ "$BUILD_OK" = 1 ] && [ "$ONLY" = none ]; then
  skip ctest_gpu "the precheck failed"
elif [ "$BUILD_OK" = 1 ] && [ "$ONLY" = bench ]; then
  skip ctest_gpu "GPTC_GPU_ONLY=bench"
elif [ "$BUILD_OK" = 1 ]; then
  # (cd; ctest) rather than --test-dir, which needs CMake 3.20; the compute-sanitizer runs
  # (label sanitizer) are the next stage
  stage ctest_gpu 30 300 bash -c "cd '$BUILD' && ctest --output-on-failure -L gpu -LE sanitizer --timeout ${GPTC_GPU_CTEST_TIMEOUT_S:-240}"
  if grep -q 'No tests were found' "$RES/ctest_gpu.log" 2>/dev/null; then
    note "               (no test carries the gpu label yet)"
  fi
  grep -E 'tests passed|tests failed' "$RES/ctest_gpu.log" 2>/dev/null | sed 's/^/               /' | tee -a "$SUM"
  # GPU tests exit 77 (skipped) when they see no GPU: on this machine that is a failure.
  nskip=$(grep -c '(Skipped)' "$RES/ctest_gpu.log" 2>/dev/null)
  if [ "${nskip:-0}" -gt 0 ]; then
    if nvidia-smi -L >/dev/null 2>&1; then
      note "               $nskip gpu test(s) SKIPPED although nvidia-smi sees a GPU: counted as a failure"
      NFAIL=$((NFAIL + 1))
    else
      note "               $nskip gpu test(s) skipped: no GPU here"
    fi
  fi
  cp "$BUILD/Testing/Temporary/LastTest.log" "$RES/ctest_LastTest.log" 2>/dev/null
else
  skip ctest_gpu "no build"
fi

# compute-sanitizer memcheck, racecheck and synccheck on the op tests, before the benchmarks: the
# racecheck is the one check of the kernels' shared-memory barriers and cp.async waits on a
# real GPU, and on the quick shapes it takes seconds (1.1 s + 3.6 s on an H200)
if [ "$BUILD_OK" = 1 ] && [ "${GPTC_GPU_SANITIZER:-1}" = 0 ]; then
  skip ctest_sanitizer "GPTC_GPU_SANITIZER=0"
elif [ "$BUILD_OK" = 1 ] && [ "$ONLY" != bench ] && [ "$ONLY" != none ]; then
  stage ctest_sanitizer 30 200 bash -c "cd '$BUILD' && ctest --output-on-failure -L sanitizer -R '${GPTC_GPU_SANITIZER_REGEX:-.}' --timeout 180"
  grep -q 'No tests were found' "$RES/ctest_sanitizer.log" 2>/dev/null &&
    note "               (no compute-sanitizer found at configure time)"
fi

# ------------------------------------------------------------------------ benchmarks
# Each gets its own results folder and the build folder's path; what it prints is its log.
shopt -s nullglob
BENCHES=("$BENCH_DIR"/bench_*.sh "$BENCH_DIR"/bench_*.py)
shopt -u nullglob
[ "${#BENCHES[@]}" = 0 ] && note "$(printf '%-14s none      no benchmarks/gpu/bench_*.sh or bench_*.py yet' benchmarks)"
[ "$ONLY" = tests ] || [ "$ONLY" = none ] && BENCHES=()
# the budget may end before the last: the figures the issue asks first go first
ORDER=${GPTC_GPU_BENCH_ORDER-bench_gpt2 bench_kernel_attention bench_contention bench_ncu_attention}
ORDERED=()
for want in $ORDER; do
  for b in "${BENCHES[@]}"; do
    name=$(basename "$b"); [ "${name%.*}" = "$want" ] && ORDERED+=("$b")
  done
done
for b in $(printf '%s\n' "${BENCHES[@]}" | sort); do
  name=$(basename "$b"); case " $ORDER " in *" ${name%.*} "*) ;; *) ORDERED+=("$b") ;; esac
done
for b in "${ORDERED[@]}"; do
  name=$(basename "$b"); name=${name%.*}
  mkdir -p "$RES/$name"
  case $b in
    *.sh) runner=bash ;;
    *.py) runner=python3 ;;
  esac
  GPTC_BUILD=$BUILD GPTC_BENCH_OUT=$RES/$name \
    stage "$name" 30 "${GPTC_GPU_BENCH_TIMEOUT_S:-180}" "$runner" "$b"
done


# A few steps of the PyTorch peer: proves torch_gpt2.py runs on this GPU and gives a
# first bf16 number. Last, so that it never takes time from the stages above.
if [ "${GPTC_GPU_TORCH_SMOKE:-0}" = 1 ] && [ "$ONLY" = all ]; then
  stage torch_smoke 60 120 python3 "$HERE/torch_gpt2.py" --precision bf16 --micro-batch 8 \
    --warmup 3 --steps 5
  grep '^{' "$RES/torch_smoke.log" 2>/dev/null | tail -1 > "$RES/torch_smoke.json"
fi

# ------------------------------------------------------------------------ summary
{
  echo
  echo "machine (from prepare.sh):"
  if [ -f "$RES/prepare-summary.txt" ]; then sed 's/^/  /' "$RES/prepare-summary.txt"
  else echo "  (no prepare summary)"; fi
  echo
  echo "stages failed: $NFAIL; elapsed $(elapsed) s of ${BUDGET} s"
} >> "$SUM"
pack
echo "run_all: summary in $SUM"
cat "$SUM"
[ "$NFAIL" = 0 ]
