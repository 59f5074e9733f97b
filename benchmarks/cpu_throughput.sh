#!/usr/bin/env bash
# CPU training throughput, gptc vs PyTorch eager, side by side, 2 threads each.
#
# Shapes: a small model (4 layers, 4 heads, d_model 256, seq 128, batch 8, vocab 4096)
# and GPT-2 124M (12 layers, 12 heads, d_model 768, n_ctx 1024, vocab 50257) at seq 64,
# batch 4. Both sides train on synthetic random tokens from a random init; ms/step is the
# median over the steps after the first 2 (those pay for page faults and warm-up).
# Peak RSS: /usr/bin/time -v for gptc, getrusage inside the PyTorch process.
#
# Usage: benchmarks/cpu_throughput.sh        (env: GPTC_BUILD=build dir, STEPS=10,
#                                             STEPS_124M=6, KEEP=1 keeps the work dir)
set -euo pipefail

# OpenBLAS tuning overrides left in the environment would make the two sides use
# different kernels than a plain run does. gptc picks OpenBLAS's kernel for the CPU
# itself (engine/cpu/cpu_blas.c); OpenBLAS 0.3.21 alone falls back to its SSE3 kernels on
# CPUs newer than it knows. For a fair picture PyTorch runs twice: as installed, and with
# OPENBLAS_CORETYPE set to the kernel gptc chose.
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
export OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${GPTC_BUILD:-$ROOT/build}
GPTC=$BUILD/gptc-train
PY=/usr/bin/python3                    # Debian's interpreter: it has torch and h5py
STEPS=${STEPS:-10}
STEPS_124M=${STEPS_124M:-6}
for v in STEPS STEPS_124M; do  # the medians are of steps 3 and on
  case ${!v} in ''|*[!0-9]*) echo "cpu_throughput.sh: $v=${!v} is not a whole number" >&2; exit 2 ;; esac
  if [ "${!v}" -lt 3 ]; then
    echo "cpu_throughput.sh: $v=${!v}: need 3 or more (steps 1 and 2 are not timed)" >&2; exit 2
  fi
done
WORK=$(mktemp -d /tmp/gptc-bench.XXXXXX)
if [ "${KEEP:-0}" = 1 ]; then echo "work dir: $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi

# name n_layer n_head d_model n_ctx seq batch vocab steps
SHAPES=(
    "small 4 4 256 128 128 8 4096 $STEPS"
    "gpt2-124m 12 12 768 1024 64 4 50257 $STEPS_124M"
)

blas_info() {
    # threadpoolctl names the BLAS and its thread count; without it, torch's build
    # config plus the BLAS library actually mapped into the process after a matmul
    # (Debian's torch says BLAS_INFO=generic and links libblas.so.3 via alternatives).
    $PY - <<'EOF'
import re, torch
torch.set_num_threads(2)
torch.ones(64, 64) @ torch.ones(64, 64)
try:
    from threadpoolctl import threadpool_info
    for i in threadpool_info():
        print(f"  threadpoolctl: {i.get('internal_api')} {i.get('version')} "
              f"threads={i.get('num_threads')} {i.get('filepath')}")
except ImportError:
    blas = [l for l in torch.__config__.show().splitlines() if "BLAS" in l or "MKL" in l]
    print("  threadpoolctl not installed; torch.__config__.show():")
    for l in blas:
        for part in l.split(","):
            if re.search("BLAS|LAPACK|MKL", part):
                print("    " + part.strip())
    libs = sorted({l.split()[-1] for l in open("/proc/self/maps")
                   if re.search(r"blas|lapack|mkl|dnnl", l.split()[-1])})
    print("  libraries mapped after a matmul: " + ", ".join(libs))
print(f"  torch {torch.__version__}, intra-op threads {torch.get_num_threads()}")
EOF
}

write_tokens() {  # path n vocab
    $PY - "$@" <<'EOF'
import sys, h5py, numpy as np
path, n, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with h5py.File(path, "w") as f:
    f.create_dataset("tokens", data=np.random.default_rng(1).integers(0, vocab, n).astype(np.uint16))
    f.attrs["vocab_size"] = np.int64(vocab)
EOF
}

median_iter_ms() {  # metrics.jsonl -> median iter_ms of steps > 2
    $PY - "$1" <<'EOF'
import sys, json, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ms = [r["iter_ms"] for r in rows if r["step"] > 2]
print(f"{statistics.median(ms):.3f}" if ms else "nan")
EOF
}

# Prints "ms tokens_per_s peak_rss_mb" for gptc at one shape, or "n/a n/a n/a".
run_gptc() {  # name L H C n_ctx seq batch vocab steps
    local name=$1 L=$2 H=$3 C=$4 NCTX=$5 T=$6 B=$7 V=$8 N=$9
    if [ ! -x "$GPTC" ]; then echo "n/a n/a n/a"; return; fi
    local tok=$WORK/$name-tokens.h5 log=$WORK/$name-gptc.jsonl tv=$WORK/$name-gptc.time
    write_tokens "$tok" $((N * B * T + 1)) "$V"
    if ! /usr/bin/time -v -o "$tv" "$GPTC" \
        --model.n_layer="$L" --model.n_head="$H" --model.d_model="$C" --model.n_ctx="$NCTX" \
        --model.vocab_size="$V" --train.steps="$N" --train.global_batch="$B" \
        --train.micro_batch="$B" --train.seq_len="$T" --data.path="$tok" \
        --train.log_file="$log" > "$WORK/$name-gptc.out" 2>&1; then
        echo "gptc-train failed at $name; last lines:" >&2
        tail -n 5 "$WORK/$name-gptc.out" >&2
        echo "fail fail fail"; return
    fi
    local ms rss
    ms=$(median_iter_ms "$log")
    rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.1f", $2 / 1024}' "$tv")
    echo "$ms $($PY -c "print(f'{$B * $T / ($ms / 1e3):.1f}')") $rss"
}

# Prints "ms tokens_per_s peak_rss_mb" for the PyTorch baseline.
run_torch() {  # name L H C n_ctx seq batch vocab steps
    local name=$1 L=$2 H=$3 C=$4 NCTX=$5 T=$6 B=$7 V=$8 N=$9
    env ${TORCH_CORETYPE:+OPENBLAS_CORETYPE=$TORCH_CORETYPE} \
    $PY "$ROOT/benchmarks/torch_baseline.py" --n_layer "$L" --n_head "$H" --d_model "$C" \
        --n_ctx "$NCTX" --seq "$T" --batch "$B" --vocab "$V" --steps "$N" --threads 2 \
        2> "$WORK/$name-torch.err" > "$WORK/$name-torch.json"
    $PY -c "import json,sys; r = json.load(open(sys.argv[1])); \
print(r['ms_per_step'], r['tokens_per_s'], r['peak_rss_mb'])" "$WORK/$name-torch.json"
}

echo "BLAS used by PyTorch:"
blas_info
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
[ -x "$GPTC" ] || echo "note: $GPTC not found; gptc rows are n/a"
echo

TABLE="| shape | impl | ms/step | tokens/s | peak RSS MB | gptc/pytorch tokens/s |
|---|---|---|---|---|---|"
for s in "${SHAPES[@]}"; do
    set -- $s
    read -r g_ms g_tps g_rss <<< "$(run_gptc "$@")"
    read -r t_ms t_tps t_rss <<< "$(run_torch "$@")"
    core=$(sed -n 's/.*OpenBLAS kernels \([A-Za-z0-9]*\).*/\1/p' "$WORK/$1-gptc.out" 2>/dev/null | head -1)
    if [ -n "$core" ]; then
        read -r k_ms k_tps k_rss <<< "$(TORCH_CORETYPE=$core run_torch "$@")"
    else
        k_ms=n/a k_tps=n/a k_rss=n/a
    fi
    ratio() { $PY -c "
try: print(f'{float(\"$1\") / float(\"$2\"):.2f}')
except ValueError: print('n/a')"; }
    TABLE+="
| $1 | gptc (OpenBLAS ${core:-?}) | $g_ms | $g_tps | $g_rss | |
| $1 | pytorch-eager (as installed) | $t_ms | $t_tps | $t_rss | $(ratio "$g_tps" "$t_tps") |
| $1 | pytorch-eager (OPENBLAS_CORETYPE=${core:-?}) | $k_ms | $k_tps | $k_rss | $(ratio "$g_tps" "$k_tps") |"
done
echo "$TABLE"
echo
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at end (2 threads per run; a load above 2 means the timings shared the cores)"
