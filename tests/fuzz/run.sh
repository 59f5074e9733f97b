#!/usr/bin/env bash
# Builds the libFuzzer targets (config parser, HDF5 token and checkpoint loaders) with
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
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' |
    clang -x c -fsanitize=fuzzer - -o "$out/probe" 2>/dev/null; then
  echo "fuzz: clang with libFuzzer not available, skipped"
  exit 0
fi
hdf5_inc=$(pkg-config --cflags hdf5 2>/dev/null || echo -I/usr/include/hdf5/serial)
hdf5_lib=$(pkg-config --libs hdf5 2>/dev/null || echo "-L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5")
flags=(-std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -I. $hdf5_inc)
clang "${flags[@]}" tests/fuzz/fuzz_config.c engine/config.c -linih -lm -o "$out/fuzz_config"
clang "${flags[@]}" tests/fuzz/fuzz_h5.c data/tokens.c engine/checkpoint.c $hdf5_lib -lpthread -lm \
  -o "$out/fuzz_h5"

# seed corpora: the shipped config, a token file and a checkpoint written by gptc itself
mkdir -p "$out/corpus_config" "$out/corpus_h5"
cp configs/*.ini "$out/corpus_config/"
printf '[train]\nsteps = 3\n' > "$out/corpus_config/small.ini"
printf 'hello fuzzing world\n' | "$build/gptc-data" --out "$out/corpus_h5/tokens.h5" - > /dev/null
OMP_NUM_THREADS=1 "$build/gptc-train" --model.n_layer=1 --model.n_head=1 --model.d_model=8 \
  --model.n_ctx=8 --model.vocab_size=256 --data.path="$out/corpus_h5/tokens.h5" \
  --train.steps=0 --train.seq_len=4 --train.save="$out/corpus_h5/ckpt.h5" > /dev/null

# Each target runs in fork mode so that a crash does not end the run; every crash is then
# replayed and blamed on its innermost frame in libhdf5 or in gptc's sources (the frames
# above are libc, the sanitizers and libFuzzer): a crash inside
# libhdf5 itself (HDF5 1.10 does not validate all of a corrupted file; it is an upstream
# bug we can only report) is listed as such, one in gptc's own code fails the run.
status=0
for t in config h5; do
  rm -f "$out"/crash_$t-*
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1 HDF5_USE_FILE_LOCKING=FALSE \
    "$out/fuzz_$t" -seed=1 -max_total_time="$secs" -max_len=65536 -timeout=10 -fork=1 \
    -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 -artifact_prefix="$out/crash_$t-" \
    "$out/corpus_$t" > "$out/fuzz_$t.log" 2>&1 || true
  ours=0 upstream=0
  for a in "$out"/crash_$t-*; do
    [ -e "$a" ] || continue
    frame=$(ASAN_OPTIONS=detect_leaks=0 timeout 60 "$out/fuzz_$t" -timeout=5 "$a" 2>&1 |
            grep -E '^ +#[0-9]+ ' | grep -E 'libhdf5|/(engine|data|layers|parallel|tests)/' |
            head -1 || true)
    if echo "$frame" | grep -q 'libhdf5'; then
      upstream=$((upstream + 1)); echo "fuzz_$t: inside libhdf5 (upstream): $(basename "$a")"
    else
      ours=$((ours + 1)); echo "fuzz_$t: CRASH in gptc: $(basename "$a"): $frame"
    fi
  done
  echo "fuzz_$t: ${secs} s, corpus of $(ls "$out/corpus_$t" | wc -l) inputs, $ours crash(es) in gptc, $upstream inside libhdf5"
  [ "$ours" = 0 ] || status=1
done
exit $status
