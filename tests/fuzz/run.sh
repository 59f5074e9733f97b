#!/usr/bin/env bash
# Builds the libFuzzer targets (config parser, HDF5 token and checkpoint loaders, the
# demangler of CUPTI's kernel names) with
# clang + ASan and runs each from a corpus of valid files.
#   usage: tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET]
# CI runs a fixed-seed short pass (the default, 20 s each); for a long run see
# benchmarks/README.md ("Fuzzing").
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$(cd "$1" && pwd)
secs=${2:-20}
out=$build/fuzz
mkdir -p "$out"
# the HDF5 target's input files (one a process; a crash leaves its own)
export GPTC_FUZZ_TMP=$out/tmp
rm -rf "$GPTC_FUZZ_TMP" && mkdir -p "$GPTC_FUZZ_TMP"
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' |
    clang -x c -fsanitize=fuzzer - -o "$out/probe" 2>/dev/null; then
  echo "fuzz: clang with libFuzzer not available, skipped"
  exit 0
fi
hdf5_inc=$(pkg-config --cflags hdf5 2>/dev/null || echo -I/usr/include/hdf5/serial)
hdf5_lib=$(pkg-config --libs hdf5 2>/dev/null || echo "-L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5")
flags=(-std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -I. $hdf5_inc)
# the three at once, as the targets run below (set -e does not see a background job fail:
# each is waited for by its pid)
clang "${flags[@]}" tests/fuzz/fuzz_config.c engine/config.c -lm -o "$out/fuzz_config" & b1=$!
clang "${flags[@]}" tests/fuzz/fuzz_kernel_name.c engine/kernel_name.c -o "$out/fuzz_kernel_name" & b2=$!
clang "${flags[@]}" tests/fuzz/fuzz_h5.c data/tokens.c data/h5_sources.c engine/checkpoint.c engine/h5_checks.c \
  engine/output_files.c engine/log.c $hdf5_lib -lpthread -lm \
  -o "$out/fuzz_h5"
wait "$b1"
wait "$b2"

# seed corpora: the shipped config, a token file and a checkpoint written by gptc itself
mkdir -p "$out/corpus_config" "$out/corpus_h5" "$out/corpus_kernel_name"
# symbols of the shapes kernel_name reads (tests/test_timing_device.c has more)
printf '%s' '_ZN8cublasLt8epilogue4impl12globalKernelILi8ELi32EfEEvv' > "$out/corpus_kernel_name/a"
printf '%s' '_Z6kernelILin3ELb1ELb0EN2ns4TileILi64EEEEvv' > "$out/corpus_kernel_name/b"
printf '%s' '_ZSt4swapIiEvRT_S1_' > "$out/corpus_kernel_name/c"
printf '%s' 'sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cublas' > "$out/corpus_kernel_name/d"
cp configs/*.ini "$out/corpus_config/"
printf '[train]\nsteps = 3\n' > "$out/corpus_config/small.ini"
printf 'hello fuzzing world\n' | "$build/gptc-data" --out "$out/corpus_h5/tokens.h5" - > /dev/null
OMP_NUM_THREADS=1 "$build/gptc-train" --model.n_layer=1 --model.n_head=1 --model.d_model=8 \
  --model.n_ctx=8 --model.vocab_size=256 --data.path="$out/corpus_h5/tokens.h5" \
  --train.steps=0 --train.seq_len=4 --train.save="$out/corpus_h5/ckpt.h5" > /dev/null

# Each target runs in-process; a crash (or a hang past -timeout, or an allocation beyond
# -rss_limit_mb) ends the run with the sanitizer's stack in the log, and the fuzzer is
# restarted on the grown corpus with the next seed until the time is up. Every crash is
# blamed on the innermost frame of its own stack that lies in libhdf5 or in gptc's
# sources (the frames above are libc, the sanitizers and libFuzzer). The stack is taken
# from the crash itself, not from a replay: some of libhdf5's crashes depend on state an
# earlier input left in the library and do not recur when their input runs alone. A crash
# inside libhdf5 (HDF5 1.10 does not validate all of a corrupted file; an upstream bug we
# can only report) is listed as such; one in gptc's own code, or one with no frame in
# either, fails the run.
# The three targets run side by side, each for the whole time (on CI's 2 cores, two
# thirds of a core each: the stage took their sum, a minute); each one's exit status says
# whether it found a crash in gptc.
fuzz_target() {
  local t=$1
  rm -f "$out"/crash_$t-* "$out"/fuzz_$t.*.log
  ours=0 upstream=0 run=0
  end=$((SECONDS + secs))
  while :; do
    # read once: a second that ticks between the test and the flag would give
    # -max_total_time=0, which libFuzzer takes as no limit at all
    left=$((end - SECONDS))
    [ "$left" -gt 0 ] || break
    run=$((run + 1))
    log="$out/fuzz_$t.$run.log"
    # allocator_may_return_null: an absurd size read from a corrupted file makes malloc fail
    # (which the library must handle) rather than end the run
    if ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
       UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
       HDF5_USE_FILE_LOCKING=FALSE "$out/fuzz_$t" -seed="$run" -max_total_time="$left" \
       -max_len=65536 -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$out/crash_$t-" \
       "$out/corpus_$t" > "$log" 2>&1; then
      break # the time is up without a crash
    fi
    what=$(grep -m1 -E 'ERROR: (AddressSanitizer|libFuzzer|UndefinedBehaviorSanitizer)|runtime error' \
           "$log" || echo "exit without a report")
    frame=$(grep -E '^ +#[0-9]+ ' "$log" | grep -E 'libhdf5|/(engine|data|layers|parallel|tests)/' |
            head -1 || true)
    if echo "$frame" | grep -q 'libhdf5'; then
      upstream=$((upstream + 1))
      echo "fuzz_$t: inside libhdf5 (upstream): ${what#*ERROR: }"
    else
      ours=$((ours + 1))
      echo "fuzz_$t: CRASH in gptc (log $log): ${what#*ERROR: }: ${frame:-no frame in libhdf5 or gptc}"
    fi
  done
  echo "fuzz_$t: ${secs} s in $run run(s), corpus of $(ls "$out/corpus_$t" | wc -l) inputs, $ours crash(es) in gptc, $upstream inside libhdf5"
  [ "$ours" = 0 ]
}
pids=()
for t in config h5 kernel_name; do
  fuzz_target "$t" & pids+=($!)
done
status=0
for p in "${pids[@]}"; do
  wait "$p" || status=1
done
exit $status
