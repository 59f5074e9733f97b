#!/usr/bin/env bash
# Nsight Compute on gptc's attention kernels: one call of each (the fp32 and the bf16
# forward, D = rowsum(dout * out), dk/dv and dq) through attention_bench at GPT-2 124M's
# head shape (B 8, T 1024, NH 12, hs 64), with the sections that say why a kernel runs at
# the speed bench_kernel_attention measures: speed of light, occupancy and launch
# statistics (registers, shared memory), warp stall reasons, issue slots, pipe and memory
# use. Tuning attention.cu and attention_bf16_*.cu starts from this report.
#
# Output in $GPTC_BENCH_OUT: ncu_attention.txt (ncu's text report), which is also printed,
# ncu_attention_stalls.txt (the bf16 kernels' warp stall reasons and instruction mix),
# and attention_sass.txt: per attention kernel of the build, how many shared-memory loads
# of each form its sm_90 SASS holds (cuobjdump). The fp32 kernels' cost model (top of
# engine/cuda/attention.cu) assumes ptxas pairs the 16-byte loads that lanes n and n ^ 1
# share (LDS.U.128); this says whether it did.
# No ncu on the machine: says so and exits 0. ncu present but unable to profile (it could
# not read the counters on one of the device tool's runtimes, see the device library's
# KINDS.md): its message is in the report and the exit status is ncu's.
# Needs $GPTC_BUILD/attention_bench.
set -uo pipefail
OUT=${GPTC_BENCH_OUT:?GPTC_BENCH_OUT: the results folder}
BUILD=${GPTC_BUILD:?GPTC_BUILD: the build folder}
NCU=$(command -v ncu || ls -d /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
if [ -z "$NCU" ]; then
  echo "bench_ncu_attention: no ncu on PATH, in /usr/local/cuda/bin or /opt/nvidia: skipped"
  exit 0
fi
if [ ! -x "$BUILD/attention_bench" ]; then
  echo "bench_ncu_attention: $BUILD/attention_bench not built" >&2
  exit 1
fi
mkdir -p "$OUT"
CUOBJDUMP=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -n 1)
if [ -n "$CUOBJDUMP" ]; then
  "$CUOBJDUMP" -sass "$BUILD/attention_bench" 2>/dev/null | awk '
    /Function :/ { fn = $3 }
    fn ~ /attention/ && match($0, /LDSM?(\.[A-Z0-9]+)*/) { n[fn " " substr($0, RSTART, RLENGTH)]++ }
    END { for (k in n) print k, n[k] }' | sort > "$OUT/attention_sass.txt"
  echo "shared-memory loads per attention kernel (SASS):"
  cat "$OUT/attention_sass.txt"
fi
"$NCU" --version | tail -n 1
# warm-up 0, 1 timed call: each kernel is launched 2 or 3 times per precision (forward,
# backward, forward + backward), and every launch is profiled (16 in all)
timeout -k 5 150 "$NCU" --kernel-name regex:attention \
  --section SpeedOfLight --section Occupancy --section LaunchStats \
  --section WarpStateStats --section SchedulerStats \
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  "$BUILD/attention_bench" 8 1024 12 64 both 0 1 > "$OUT/ncu_attention.txt" 2>&1
rc=$?
cat "$OUT/ncu_attention.txt"
# Why the bf16 kernels' warps wait: the text report above gives issue-slot use (about half
# on an H100 for the forward, 2026-11-27) but not the stall reasons, which need their own
# metrics; apart, so that a metric this ncu lacks loses only this part. One launch each.
timeout -k 5 100 "$NCU" --kernel-name regex:attention_bf16 --launch-count 3 \
  --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_op_ldsm.sum,smsp__inst_executed.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active' \
  "$BUILD/attention_bench" 8 1024 12 64 both 0 1 > "$OUT/ncu_attention_stalls.txt" 2>&1
echo "ncu stall reasons: exit $?"
cat "$OUT/ncu_attention_stalls.txt"
exit $rc
