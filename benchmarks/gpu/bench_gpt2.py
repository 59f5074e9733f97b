#!/usr/bin/env python3
"""GPT-2 124M, T = 1024, on one GPU: gptc against PyTorch in the same run, and the cost
of gptc's per-kernel timing.

Rows (one JSON line each in $GPTC_BENCH_OUT/gpt2.jsonl, a table in gpt2.md), in the order
they run, so that a budget that ends early cuts the least needed:
  gptc fp32 at the largest micro-batch M of --batches that fits, timing off;
  the same with profile.timing = kernel (CUPTI) and with GPTC_TIMER=events: the overhead;
  gptc with train.precision = bf16 at M;
  the bf16 variants not on by default, at M, each with its speed-up over the bf16 row:
  GPTC_ATTENTION_BIAS=0 (the qkv bias gradient by a pass after the attention backward, not
  by its kernels: the default before an H100 run), GPTC_ATTENTION_FWD_ROWS=64 (the
  attention forward with 64 queries a block, not 128: likewise), GPTC_ATTENTION_DQ=atomic (the attention backward's dq from its dk/dv kernel, added by
  atomics), GPTC_ATTENTION_DQ=fused (the same by parts summed in order),
  GPTC_ATTENTION_FWD=pipelined (its next key tile's scores under this tile's softmax),
  GPTC_ATTENTION_FWD=wide (flash attention 2's shape: 128 queries by 128 keys a block),
  GPTC_GEMM_CANDIDATES=8 (each GEMM's first 8 cuBLASLt candidates timed, the fastest kept);
  gptc bf16 at 2, 4 and 8 times M, up to the first that does not fit (bf16's own largest);
  bf16_best_bL: the variants that beat the bf16 row, together, at that largest L, beside
  the plain row there (what switching them on would give);
  bf16 with kernel timing (its log holds the per-op table of a bf16 step and the device
  kernels behind each op, bf16_report_bM.json both, the latter also as
  bf16_device_kernels_bM.md, and its trace gives bf16_steady_ops_bM.md, the same for the
  steps after the first);
  PyTorch fp32 (TF32 off), bf16 autocast, and bf16 + torch.compile at M;
  then gptc fp32 and each PyTorch row that ran at 2, 4 and 8 times M, up to the first that
  does not fit (fp32_b2M, torch_bf16_compile_b4M, ...): each at its largest micro-batch.
GPTC_BENCH_ROWS=issue leaves out the timing, variant and best rows (issue 5's figures
alone); =bf16 the fp32, timing-overhead and candidate rows.
MFU counts 6 * params + 12 * layers * T * d_model FLOPs per token (as torch_gpt2.py) over
the card's dense peak for the precision (H100/H200: fp32 67, bf16 989 TFLOP/s).
gptc's ms/step is its own mean over the steps after the first. A timed row's overhead is
taken on the steps' wall clock, which holds what the timing does after each step (reading
the records back, the step's analysis), and on iter_ms alone.

Needs: $GPTC_BUILD (gptc-train, gptc-data), python3 with torch for the peer rows.
Every run has a time limit; a failed or timed-out row is recorded as such."""
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("GPTC_BUILD", os.path.join(ROOT, "build"))
# smoke tests on a CPU machine: GPTC_BENCH_EXTRA="--train.device=cpu --model.n_layer=1 ..."
EXTRA = os.environ.get("GPTC_BENCH_EXTRA", "").split()
OUT = os.environ.get("GPTC_BENCH_OUT", os.path.join(ROOT, "gpu-results", "bench_gpt2"))
BUDGET_S = float(os.environ.get("GPTC_BENCH_BUDGET_S", "170"))
# GPTC_BENCH_ROWS=bf16: the bf16 rows alone (gptc at the first of GPTC_BENCH_BATCHES and
# the climb, the per-op table, PyTorch bf16 eager and compiled at that micro-batch), a
# recheck of a bf16 change in half the time; no fp32, timing-overhead or candidate rows
BF16_ONLY = os.environ.get("GPTC_BENCH_ROWS", "all") == "bf16"
# GPTC_BENCH_ROWS=issue: the figures issue 5 asks for and nothing else, in one device call:
# gptc fp32 and bf16 and the three PyTorch rows, each at its largest micro-batch; no timing,
# variant or best rows (measured before), so that the budget goes to the climbs
ISSUE_ONLY = os.environ.get("GPTC_BENCH_ROWS", "all") == "issue"
if os.environ.get("GPTC_BENCH_ROWS", "all") not in ("all", "bf16", "issue"):
    sys.exit(f"GPTC_BENCH_ROWS={os.environ['GPTC_BENCH_ROWS']}: all, bf16 or issue")
BF16_STEPS = 16  # the bf16 rows at the first micro-batch: 15 timed steps after the first
START = time.time()
N_LAYER, D_MODEL, T, VOCAB = 12, 768, 1024, 50257
PARAMS = 124475904  # every parameter, the padded wte (50304 rows) included
PEAK = {"fp32": 67e12, "bf16": 989e12}


def left():
    return BUDGET_S - (time.time() - START)


def record(row):
    print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "gpt2.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def gptc(tag, micro, steps, extra, env_extra=None, timeout=120, precision="fp32"):
    cfg = os.path.join(ROOT, "configs", "gpt2-124m.ini")
    args = [os.path.join(BUILD, "gptc-train"), cfg, f"--train.micro_batch={micro}",
            f"--train.global_batch={micro}", f"--train.steps={steps}",
            f"--data.path={OUT}/tokens.h5", f"--train.precision={precision}"] + extra + EXTRA
    env = dict(os.environ, **(env_extra or {}))
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=min(timeout, max(left(), 5)),
                           env=env)
    except subprocess.TimeoutExpired:
        return {"impl": "gptc", "row": tag, "micro_batch": micro, "error": "timeout"}
    with open(os.path.join(OUT, f"gptc_{tag}_b{micro}.log"), "w") as f:
        f.write(r.stdout + r.stderr)
    m = re.search(r"mean ([0-9.]+) ms/step, ([0-9.]+) tok/s", r.stdout)
    if r.returncode or not m:
        err = (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
        return {"impl": "gptc", "row": tag, "micro_batch": micro, "error": err[:300]}
    ms, tps = float(m.group(1)), float(m.group(2))
    flops = (6 * PARAMS + 12 * N_LAYER * T * D_MODEL) * tps
    row = {"impl": "gptc", "row": tag, "precision": precision, "micro_batch": micro, "T": T,
           "ms_per_step": ms, "tokens_per_s": tps, "mfu": flops / PEAK[precision]}
    # the step's wall clock, with what kernel timing does around iter_ms (reading the
    # records back, the step's analysis): the timing overhead counts it
    w = re.search(r"wall clock ([0-9.]+) ms/step", r.stdout)
    if w:
        row["wall_ms_per_step"] = float(w.group(1))
    return row


def overhead(timed, base):
    """timed's overhead over base: of the wall clock (bookkeeping included) where both
    have it, and of iter_ms alone"""
    out = {"overhead_iter_vs_off": timed["ms_per_step"] / base["ms_per_step"] - 1}
    if "wall_ms_per_step" in timed and "wall_ms_per_step" in base:
        out["overhead_vs_off"] = timed["wall_ms_per_step"] / base["wall_ms_per_step"] - 1
    else:
        out["overhead_vs_off"] = out["overhead_iter_vs_off"]
    return out


def torch_row(precision, compile_, micro, timeout=150):
    args = [sys.executable, os.path.join(HERE, "torch_gpt2.py"), "--precision", precision,
            "--micro-batch", str(micro), "--warmup", "3", "--steps", "8"]
    if compile_:
        args.append("--compile")
    tag = f"torch_{precision}{'_compile' if compile_ else ''}"
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=min(timeout, max(left(), 5)))
    except subprocess.TimeoutExpired:
        return {"impl": "torch", "row": tag, "micro_batch": micro, "error": "timeout"}
    with open(os.path.join(OUT, f"{tag}_b{micro}.log"), "w") as f:
        f.write(r.stdout + r.stderr)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode or not lines:
        err = (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
        return {"impl": "torch", "row": tag, "micro_batch": micro, "error": err[:300]}
    row = json.loads(lines[-1])
    row["row"] = tag
    return row


# the climb past the first micro-batch M: each of gptc fp32, gptc bf16 and the PyTorch peers
# is run again at these multiples of M until one fails (out of memory is that row's error),
# so that each is reported at the largest micro-batch that fits (on an H100, gptc bf16's is
# 4 M = 128; on an H200, 8 M might fit)
CLIMB = (2, 4, 8)


def climb(run, micro, rows, need_s=40):
    """run(m) at each CLIMB multiple of micro while the budget has need_s seconds left,
    recording each row into rows, until one fails; returns the last row that ran (None if
    none did)"""
    largest = None
    for factor in CLIMB:
        if left() < need_s:
            break
        row = run(factor * micro)
        record(row)
        rows.append(row)
        if "error" in row:
            break
        largest = row
    return largest


def bf16_variant(tag, micro, env, bf):
    """gptc bf16 at micro with env added, noted with its speed-up over the bf16 row bf (when
    that ran)"""
    row = gptc(tag, micro, BF16_STEPS, [], env, precision="bf16")
    if bf and "ms_per_step" in row:
        row["speedup_vs_bf16"] = bf["ms_per_step"] / row["ms_per_step"]
    return row


def best_env(results):
    """The environment of the best row from (part, speed-up over the bf16 row, env) of the
    variants that ran: for each part of the step, that of its fastest variant, where it
    beat the bf16 row (the two forward variants are one part: one kernel runs)"""
    best = {}
    for part, gain, env in results:
        if gain > 1 and gain > best.get(part, (0, None))[0]:
            best[part] = (gain, env)
    return {k: v for _, env in best.values() for k, v in env.items()}


def steady_ops(trace, out):
    """steady_ops.py's table of trace into out; the trace (tens of MB) is then removed"""
    if not os.path.exists(trace):
        return
    r = subprocess.run([sys.executable, os.path.join(HERE, "steady_ops.py"), trace],
                       capture_output=True, text=True)
    with open(out, "w") as f:
        f.write(r.stdout + r.stderr)
    print(r.stdout + r.stderr, flush=True)
    os.remove(trace)


def device_kernels(report, out):
    """The timed row's report's device_kernels (the kernels CUPTI saw behind each op) as a
    markdown table in out: per op, its kernels, calls per op call, mean and ms per step"""
    try:
        with open(report) as f:
            dev = json.load(f)["device_kernels"]
    except (OSError, ValueError, KeyError) as e:
        print(f"device kernels: {report}: {e}", flush=True)
        return
    with open(out, "w") as f:
        f.write("Device kernels behind each op (CUPTI; the timed bf16 row, steps after the "
                "first)\n\n| op | kernel | per call | mean us | ms/step |\n|---|---|---|---|---|\n")
        last = None
        for d in dev:
            per = d["per_op_call"]
            f.write(f"| {d['op'] if d['op'] != last else ''} | `{d['kernel']}` | "
                    f"{'' if per is None else f'{per:.2f}'} | {d['mean_us']:.1f} | "
                    f"{d['total_us_per_step'] / 1e3:.3f} |\n")
            last = d["op"]


def main():
    os.makedirs(OUT, exist_ok=True)
    sources = sorted(os.path.join(d, f) for d in ("engine", "layers", "parallel")
                     for f in os.listdir(os.path.join(ROOT, d)) if f.endswith(".c"))
    subprocess.run([os.path.join(BUILD, "gptc-data"), "--vocab", str(VOCAB), "--out",
                    f"{OUT}/tokens.h5"] + [os.path.join(ROOT, s) for s in sources], check=True,
                   capture_output=True)
    rows = []
    micro = None
    batches = [int(x) for x in os.environ.get("GPTC_BENCH_BATCHES", "32,16,8,4").split(",")]
    if BF16_ONLY:
        micro, batches = batches[0], []
    for b in batches:
        if left() < 30:
            break
        row = gptc("fp32", b, 6, [])
        record(row)
        if "error" not in row:
            rows.append(row)
            micro = b
            break
    if micro is None:
        print("no micro-batch ran; see the logs", file=sys.stderr)
        return 1
    for tag, extra, env in (("fp32_timing_cupti", ["--profile.timing=kernel"], None),
                            ("fp32_timing_events", ["--profile.timing=kernel"], {"GPTC_TIMER": "events"})):
        if left() < 30 or BF16_ONLY or ISSUE_ONLY:
            break
        row = gptc(tag, micro, 6, extra, env)
        if "ms_per_step" in row and "ms_per_step" in rows[0]:
            row.update(overhead(row, rows[0]))
        record(row)
        rows.append(row)
    # precision = bf16: bf16 activations and parameter copy, tensor-core products; bf, the
    # row the later bf16 rows are compared with (None if it did not run)
    bf = None
    if left() >= 30:
        # 16 steps, as every bf16 row it is compared with at this micro-batch (the timed
        # row's overhead was +3.1% and +1.8% on one H100 against 6 untimed steps)
        row = gptc("bf16", micro, BF16_STEPS, [], precision="bf16")
        record(row)
        rows.append(row)
        bf = row if "ms_per_step" in row else None
    # The variants that are not the default, each at this micro-batch beside the bf16 row,
    # each with the part of the step it replaces: the defaults before an H100 run (the qkv
    # bias gradient by a pass after the attention backward, not taken by its kernels while
    # they hold dqkv; the attention forward with 64-query blocks, not 128); the forward's
    # pipelined key tiles, or 128-query blocks streaming 128 keys a stage (flash attention
    # 2's shape); the backward's dq from its dk/dv kernel (5 tile products a pair instead
    # of 7), added by fp32 atomics into one dq (as flash attention 2) or by a pass over
    # fp32 parts; attention_bf16_*.cu; and cuBLASLt's algorithms
    variants = (("bf16_attn_bias_pass", "bias", {"GPTC_ATTENTION_BIAS": "0"}),
                ("bf16_rows64", "fwd", {"GPTC_ATTENTION_FWD_ROWS": "64"}),
                ("bf16_dq_atomic", "dq", {"GPTC_ATTENTION_DQ": "atomic"}),
                ("bf16_dq_fused", "dq", {"GPTC_ATTENTION_DQ": "fused"}),
                ("bf16_fwd_pipelined", "fwd", {"GPTC_ATTENTION_FWD": "pipelined"}),
                ("bf16_fwd_wide", "fwd", {"GPTC_ATTENTION_FWD": "wide"}),
                # each GEMM's first 8 cuBLASLt candidates timed at its first call and the
                # fastest kept (off by default: runs may then differ in the last bits); its
                # log says, per product, which candidate won and by how much
                ("bf16_gemm_candidates8", "gemm", {"GPTC_GEMM_CANDIDATES": "8"}))
    results = []  # (part, speed-up, env) of each variant that ran
    for tag, part, env in variants if bf and not ISSUE_ONLY else ():
        if left() < 30:
            break
        row = bf16_variant(tag, micro, env, bf)
        record(row)
        rows.append(row)
        if "speedup_vs_bf16" in row:
            results.append((part, row["speedup_vs_bf16"], env))
    faster = best_env(results)
    # bf16 activations take half the bytes: bf16's own largest micro-batch may be twice or
    # four times fp32's (GPT-2 124M at micro-batch 128 needs about 54 GB, which an H100's 80
    # hold). Each precision at its largest is the figure asked for. Out of memory is
    # recorded as that row's error, and ends the climb.
    def bf16_at(m):
        row = gptc("bf16", m, 6, [], precision="bf16")
        row["row"] = f"bf16_b{m}"
        return row

    largest = climb(bf16_at, micro, rows) if bf else None  # bf16's largest row past micro
    # the faster variants together at the largest micro-batch: the figure the defaults
    # would give if they were switched on, beside the plain row at the same micro-batch
    # (or at micro, where the climb did not get past it)
    if faster and left() >= 40:
        plain = largest or bf
        big = plain["micro_batch"]
        row = gptc("bf16_best", big, 6 if largest else BF16_STEPS, [], faster,
                   precision="bf16")
        row["row"] = f"bf16_best_b{big}"
        row["env"] = " ".join(f"{k}={v}" for k, v in sorted(faster.items()))
        if "ms_per_step" in row:
            row["speedup_vs_bf16"] = plain["ms_per_step"] / row["ms_per_step"]
        record(row)
        rows.append(row)
    # bf16 with per-kernel timing, whose log holds the per-op table and the device kernels
    # behind each op (profile.warmup = 1: the first step, which holds lazy module loading
    # and is ~4x a later one, left out), whose report keeps both (bf16_report_b*.json),
    # and whose trace gives steady_ops.py's table
    if bf and left() >= 30 and not ISSUE_ONLY:
        trace = os.path.join(OUT, "bf16_trace.json")
        report = os.path.join(OUT, f"bf16_report_b{micro}.json")
        row = gptc("bf16_timing_cupti", micro, BF16_STEPS,
                   ["--profile.timing=kernel", "--profile.warmup=1", f"--profile.trace={trace}",
                    f"--profile.report={report}"],
                   precision="bf16")
        row.update(overhead(row, bf) if "ms_per_step" in row else {})
        record(row)
        rows.append(row)
        steady_ops(trace, os.path.join(OUT, f"bf16_steady_ops_b{micro}.md"))
        device_kernels(report, os.path.join(OUT, f"bf16_device_kernels_b{micro}.md"))
    # the peers at this micro-batch (after gptc's own rows: when the budget runs short, the
    # figures a change is measured by come first)
    peers = [p for p in (("fp32", False), ("bf16", False), ("bf16", True))
             if not (BF16_ONLY and p[0] == "fp32")]
    ran = []  # the peers that ran at micro
    for precision, compile_ in peers:
        if left() < 40:
            break
        row = torch_row(precision, compile_, micro)
        record(row)
        rows.append(row)
        if "error" not in row:
            ran.append((precision, compile_))
    # then gptc fp32 and each peer that ran climb to their largest micro-batch, the least
    # needed rows last
    if not BF16_ONLY and "ms_per_step" in rows[0]:
        def fp32_at(m):
            row = gptc("fp32", m, 4, [])
            row["row"] = f"fp32_b{m}"
            return row
        climb(fp32_at, micro, rows)
    for precision, compile_ in ran:
        def peer_at(m, precision=precision, compile_=compile_):
            row = torch_row(precision, compile_, m)
            row["row"] += f"_b{m}"
            return row
        climb(peer_at, micro, rows)
    base = next((r["tokens_per_s"] for r in rows if r.get("row") == "fp32" and "tokens_per_s" in r),
                None)
    with open(os.path.join(OUT, "gpt2.md"), "w") as f:
        gpu = next((r["gpu"] for r in rows if "gpu" in r), "see nvidia-smi in the summary")
        f.write(f"GPT-2 124M, T={T}, micro-batch {micro}, one GPU ({gpu})\n\n")
        f.write("| row | ms/step | tokens/s | MFU | vs gptc fp32 | note |\n|---|---|---|---|---|---|\n")
        for r in rows:
            if "error" in r:
                f.write(f"| {r['row']} | | | | | {r['error']} |\n")
                continue
            ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else ""
            note = ""
            if "overhead_vs_off" in r:
                note = (f"timing overhead {r['overhead_vs_off']:+.1%} of the wall clock "
                        f"({r['overhead_iter_vs_off']:+.1%} of iter_ms)")
            if "speedup_vs_bf16" in r:
                note = f"{r['speedup_vs_bf16']:.3f}x the bf16 row at its micro-batch"
            if "env" in r:
                note += f" ({r['env']})"
            mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else ""
            f.write(f"| {r['row']} | {r['ms_per_step']:.1f} | {r['tokens_per_s']:.0f} | {mfu} | "
                    f"{ratio} | {note} |\n")
    print(open(os.path.join(OUT, "gpt2.md")).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
