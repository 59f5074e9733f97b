#!/usr/bin/env bash
# Installs what is missing (Debian/Ubuntu), builds, then either trains the default model
# (demo) or runs the whole test suite (test).   usage: bash tools/setup.sh demo|test
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-demo}
case "$mode" in demo|test) ;; *) echo "usage: bash tools/setup.sh demo|test" >&2; exit 2 ;; esac

build_pkgs=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libhdf5-dev
            libopenblas-dev libopenblas-openmp-dev libopenblas0-pthread)
# the test suite compares with PyTorch, reads HDF5 from Python (Debian's interpreter) and
# draws the overlap sweep's figures (test_bench_smoke)
test_pkgs=(python3 python3-numpy python3-h5py python3-torch python3-matplotlib clang)
want=("${build_pkgs[@]}")
[ "$mode" = test ] && want+=("${test_pkgs[@]}")
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # libFuzzer's runtime: its own package on Debian 12; elsewhere clang may carry it
  if [ "$mode" = test ]; then
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      libclang-rt-14-dev 2>/dev/null || true
  fi
fi

# each stage's start, for reading where a run's time went
stage() { echo "== setup $(date -u +%H:%M:%S) $*"; }

stage "Release build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"

if [ "$mode" = demo ]; then
  # the built-in default data: license texts that every Debian/Ubuntu system ships
  build/gptc-data --out build/demo_tokens.h5 /usr/share/common-licenses/*
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)} build/gptc-train configs/tiny.ini
else
  # -j: two tests at a time, costliest first (COST in tests/CMakeLists.txt); each makes its
  # own temporary directory, and the two that share a file are ordered by a fixture.
  # OpenMP threads that sleep when idle leave the cores to the other test's ranks (busy
  # waiting ones took 30 s more CPU and 12 s more wall time of the Release suite here).
  export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
  stage "Release tests"
  ctest --test-dir build --output-on-failure -j"$(nproc)"
  [ "${GPTC_SKIP_SANITIZERS:-0}" = 1 ] && exit 0
  # Once more under AddressSanitizer + UBSan, and the threaded tests and the kernels'
  # racecheck (tests/cuda_emu) under ThreadSanitizer.
  stage "ASan + UBSan build"
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DGPTC_SANITIZE=address -DGPTC_CUDA=OFF
  cmake --build build-asan -j"$(nproc)"
  # the unit tests that start no MPI run with the leak checker too (Open MPI's own
  # allocations make it useless for MPI programs); every other test runs without it, but
  # not test_bench_smoke, which checks the benchmarks' Python scripts (the Release run did)
  # while an ASan gptc-train is in every other test, nor test_configs_train, whose layouts
  # and policies test_layouts runs too
  leak_checked='test_buckets|test_configs|test_gradcheck|test_cpu_math|test_tokens|test_checkpoint|test_schedule|test_cpu_stream|test_power|test_cuda_emu|test_cuda_ops_emu|test_cuda_ops_emu_rows128|test_cuda_ops_emu_attn_bias|test_cuda_ops_emu_plain_pass|test_cuda_ops_emu_dq_fused|test_cuda_ops_emu_dq_fused_bias|test_cuda_ops_emu_dq_atomic|test_cuda_ops_emu_fwd_pipelined|test_cuda_ops_emu_fwd_wide|test_timing_device'
  stage "ASan + UBSan tests"
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -E "^(test_bench_smoke|test_configs_train|$leak_checked)\$"
  stage "leak-checked tests"
  ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -R "^($leak_checked)\$"
  stage "TSan build"
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DGPTC_SANITIZE=thread -DGPTC_CUDA=OFF
  cmake --build build-tsan -j"$(nproc)" --target test_cpu_stream test_tokens test_cuda_emu \
    test_cuda_ops_emu gptc-train-emu gptc-train-emu-nccl
  # (the attention variants' racechecks, but not dq_fused_bias's: its kernel is dq_fused's
  # with attn_bias's epilogue, each raced on its own, and dq_atomic's runs with the bias;
  # nor rows128's, the default forward, which test_cuda_ops_racecheck and attn_bias's race)
  stage "TSan tests"
  TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan --output-on-failure -j"$(nproc)" \
    -R '^(test_cpu_stream|test_tokens|test_cuda_emu|test_cuda_emu_race[0-9]_reported|test_cuda_ops_racecheck|test_cuda_ops_racecheck_smem99|test_cuda_ops_emu_racecheck_plain_pass|test_cuda_ops_emu_racecheck_attn_bias|test_cuda_ops_emu_racecheck_dq_fused|test_cuda_ops_emu_racecheck_dq_atomic|test_cuda_ops_emu_racecheck_fwd_pipelined|test_cuda_ops_emu_racecheck_fwd_wide|test_racecheck_train)$'
  # a short fixed-seed fuzzing pass of the config parser and the HDF5 loaders
  stage "fuzz"
  bash tests/fuzz/run.sh build 20
  stage "done"
fi
