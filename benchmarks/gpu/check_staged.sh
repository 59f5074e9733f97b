#!/bin/bash
# Two ranks on one GPU over host-staged MPI, the layouts whose collectives run on comm
# streams (tp2; dp2 with buckets): each must finish within 40 s. One that has not gets its
# ranks' stacks printed by cuda-gdb (all host threads), then is killed. Run on the GPU
# machine after run_all.sh's build, with $GPTC_BUILD set (run_all's precheck stage does).
set -u
B=${GPTC_BUILD:?GPTC_BUILD: the build folder}
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "skipped: no GPU visible"
  exit 0
fi
D=$(mktemp -d)
"$B/gptc-data" --vocab 251 --out "$D/tok.h5" engine/*.c layers/*.c > /dev/null || exit 1
STATUS=0
run() {
  local name=$1; shift
  local t0; t0=$(date +%s)
  mpirun --oversubscribe --bind-to none -np 2 "$B/gptc-train" --model.n_layer=4 --model.n_head=4 \
    --model.d_model=64 --model.n_ctx=32 --model.vocab_size=251 --data.path="$D/tok.h5" \
    --train.steps=5 --train.global_batch=8 --train.micro_batch=2 --train.seq_len=32 \
    --train.device=cuda --train.comm_timeout_s=60 "$@" > "$D/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 80); do kill -0 $pid 2>/dev/null || break; sleep 0.5; done
  if kill -0 $pid 2>/dev/null; then
    echo "HUNG  $name after 40 s; stacks:"
    for p in $(pgrep -P $pid); do
      echo "--- rank process $p"
      timeout 60 cuda-gdb -p "$p" -batch -ex 'info threads' -ex 'thread apply all bt 14' 2>&1 |
        grep -E '^(\*? *[0-9]+ +Thread|#[0-9]+|Thread )' | cut -c1-200
    done
    kill -9 $pid $(pgrep -P $pid) 2>/dev/null
    tail -5 "$D/$name.log"
    STATUS=1
  elif wait $pid; then
    echo "ok    $name in $(( $(date +%s) - t0 )) s: $(grep -m1 '^backend' "$D/$name.log")"
  else
    echo "FAIL  $name:"; tail -15 "$D/$name.log"; STATUS=1
  fi
}
run tp2 --parallel.tp=2
run dp2_bucket --parallel.dp=2 --overlap.dp=bucket --overlap.dp_bucket_mb=0.01
exit $STATUS
