"""The GPU benchmarks' scripts end to end on this machine, so that a mistake in them shows
here and not in the few minutes of a GPU call:

- benchmarks/gpu/bench_gpt2.py on the CPU backend (GPTC_BENCH_EXTRA: 2 layers, the 256
  tokens of the token file's bytes, GPTC_BENCH_ROWS=bf16): every bf16 row of its order
  runs (the variants with their speed-up, the climb, the best row exactly when a variant
  beat the bf16 row and with the variables of those that did, the timed row with its
  overhead and its steady-ops table with rates); the PyTorch rows are recorded as failed
  (no CUDA), not lost.
- benchmarks/gpu/bench_kernel_attention.py on the CUDA emulator's attention_bench
  (tests/cuda_emu), one small shape: a row of every gptc variant, its table.
- benchmarks/gpu/bench_contention.py on the emulator's gptc-train with its fake CUPTI: both
  time-sliced sections, and device-kernel tables of compute ops' kernels alone.
- benchmarks/overlap_sweep.py on its smallest matrix: flat CSV columns, its plots.
- The CPU benchmarks refuse, in one line and before any run, the settings that had ended
  them in a traceback after minutes, or printed a table of wrong columns."""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import BUILD, env, fail, work_dir  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
D = work_dir("gptc_bench_smoke_")
VARIANTS = {"bf16_attn_bias_pass": ["GPTC_ATTENTION_BIAS"],
            "bf16_rows64": ["GPTC_ATTENTION_FWD_ROWS"],
            "bf16_dq_atomic": ["GPTC_ATTENTION_DQ"],
            "bf16_dq_fused": ["GPTC_ATTENTION_DQ"],
            "bf16_fwd_pipelined": ["GPTC_ATTENTION_FWD"],
            "bf16_fwd_wide": ["GPTC_ATTENTION_FWD"],
            "bf16_gemm_candidates8": ["GPTC_GEMM_CANDIDATES"]}


def rows_of(path):
    with open(path) as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def run_bench_gpt2(out, rows, layers, T, timeout=300):
    """bench_gpt2.py on the CPU backend (a model of layers layers of d_model 64, T tokens)
    with GPTC_BENCH_ROWS=rows, its results in out; returns the CompletedProcess."""
    e = env()
    e.update(GPTC_BUILD=BUILD, GPTC_BENCH_OUT=out, GPTC_BENCH_ROWS=rows, GPTC_BENCH_BATCHES="2",
             GPTC_BENCH_BUDGET_S="240",
             GPTC_BENCH_EXTRA=f"--train.device=cpu --model.n_layer={layers} --model.d_model=64 "
                              "--model.vocab_size=256 "
                              f"--model.n_head=2 --train.seq_len={T} --model.n_ctx={T}")
    script = os.path.join(ROOT, "benchmarks", "gpu", "bench_gpt2.py")
    return subprocess.run([sys.executable, script], capture_output=True, text=True, env=e,
                          timeout=timeout)


def bench_gpt2():
    out = os.path.join(D, "gpt2")
    r = run_bench_gpt2(out, "bf16", 2, 64)
    if r.returncode:
        fail(f"bench_gpt2: exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    rows = {row["row"]: row for row in rows_of(os.path.join(out, "gpt2.jsonl"))}
    want = ["bf16", *VARIANTS, "bf16_b4", "bf16_b8", "bf16_b16", "bf16_timing_cupti",
            "torch_bf16", "torch_bf16_compile"]
    missing = [w for w in want if w not in rows]
    if missing:
        fail(f"bench_gpt2: rows {missing} missing; it wrote {sorted(rows)}")
    for tag in [*VARIANTS, "bf16", "bf16_b4", "bf16_b8", "bf16_b16", "bf16_timing_cupti"]:
        if "error" in rows[tag] or rows[tag].get("ms_per_step", 0) <= 0:
            fail(f"bench_gpt2: row {tag} did not run: {rows[tag]}")
    for tag in VARIANTS:
        if "speedup_vs_bf16" not in rows[tag]:
            fail(f"bench_gpt2: {tag} has no speed-up over the bf16 row")
    if "overhead_vs_off" not in rows["bf16_timing_cupti"]:
        fail("bench_gpt2: the timed row has no overhead")
    # a peer that failed at the first micro-batch does not climb
    climbed = [t for t in rows if t.startswith("torch_") and re.search(r"_b[0-9]+$", t)]
    if climbed:
        fail(f"bench_gpt2: the failed PyTorch rows climbed: {climbed}")
    if "error" not in rows["torch_bf16"]:
        fail("bench_gpt2: a PyTorch row ran without CUDA?")
    # the best row: exactly when a variant beat the bf16 row, at the largest micro-batch of
    # the climb, with the variables of the fastest variant of each part of the step
    won = [t for t in VARIANTS if rows[t]["speedup_vs_bf16"] > 1]
    best = rows.get("bf16_best_b16")
    if bool(won) != bool(best):
        fail(f"bench_gpt2: variants above the bf16 row {won}, best row {best}")
    part = {"bf16_attn_bias_pass": "bias", "bf16_rows64": "fwd", "bf16_dq_atomic": "dq",
            "bf16_dq_fused": "dq", "bf16_fwd_pipelined": "fwd", "bf16_fwd_wide": "fwd",
            "bf16_gemm_candidates8": "gemm"}
    best_of = {}  # part: (speed-up, variable), the first of equal speed-ups as bench_gpt2
    for t in won:
        if rows[t]["speedup_vs_bf16"] > best_of.get(part[t], (0, None))[0]:
            best_of[part[t]] = (rows[t]["speedup_vs_bf16"], VARIANTS[t][0])
    expect = {k: v for k, (_, v) in best_of.items()}
    if best and ({kv.split("=")[0] for kv in best["env"].split()} != set(expect.values())
                 or "speedup_vs_bf16" not in best):
        fail(f"bench_gpt2: the best row sets {best['env']}, the variants that won give {expect}")
    # the choice itself, on made-up speed-ups (the CPU's are noise around 1)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "gpu"))
    import bench_gpt2
    got = bench_gpt2.best_env([("dq", 1.02, {"DQ": "fused"}), ("fwd", 1.01, {"ROWS": "128"}),
                               ("fwd", 1.03, {"FWD": "pipelined"}), ("bias", 0.99, {"B": "1"}),
                               ("fwd", 0.98, {"OTHER": "1"})])
    if got != {"DQ": "fused", "FWD": "pipelined"}:
        fail(f"bench_gpt2.best_env: {got}, want the dq variant and the faster forward one")
    if bench_gpt2.best_env([("dq", 0.97, {"DQ": "fused"})]) != {}:
        fail("bench_gpt2.best_env took a slower variant")
    steady = open(os.path.join(out, "bf16_steady_ops_b2.md")).read()
    if "| TFLOP/s | GB/s |" not in steady or "| qkv_fwd | compute |" not in steady:
        fail(f"bench_gpt2: the steady-ops table lacks its rates or an op:\n{steady[:600]}")
    print(f"ok   bench_gpt2 on the CPU: {len(rows)} rows, variants above the bf16 row: "
          f"{won or 'none'}{', best row ' + best['env'] if best else ''}")


def bench_gpt2_issue():
    """GPTC_BENCH_ROWS=issue: issue 5's rows alone (gptc fp32 and bf16 climbing to their
    largest micro-batch, the PyTorch rows), none of the timing, variant or best rows."""
    out = os.path.join(D, "gpt2_issue")
    r = run_bench_gpt2(out, "issue", 1, 32)
    if r.returncode:
        fail(f"bench_gpt2 issue rows: exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    rows = {row["row"]: row for row in rows_of(os.path.join(out, "gpt2.jsonl"))}
    want = ["fp32", "bf16", "bf16_b4", "bf16_b8", "bf16_b16", "fp32_b4", "fp32_b8", "fp32_b16",
            "torch_fp32", "torch_bf16", "torch_bf16_compile"]
    unwanted = [t for t in rows if "timing" in t or t in VARIANTS or t.startswith("bf16_best")]
    missing = [w for w in want if w not in rows]
    if missing or unwanted:
        fail(f"bench_gpt2 issue rows: {missing} missing, {unwanted} not asked for; it wrote "
             f"{sorted(rows)}")
    for tag in want[:8]:
        if rows[tag].get("ms_per_step", 0) <= 0:
            fail(f"bench_gpt2 issue rows: row {tag} did not run: {rows[tag]}")
    r = run_bench_gpt2(os.path.join(D, "gpt2_bad"), "bf16s", 1, 32, timeout=60)
    if r.returncode == 0 or "GPTC_BENCH_ROWS=bf16s: all, bf16 or issue" not in r.stderr:
        fail(f"bench_gpt2: GPTC_BENCH_ROWS=bf16s was not refused: {r.returncode} {r.stderr[-300:]}")
    print(f"ok   bench_gpt2 GPTC_BENCH_ROWS=issue on the CPU: {len(rows)} rows, those asked for")


def bin_dir(name, links):
    """A folder that stands in for the build's (a benchmark's GPTC_BUILD): each name in
    links a link to the built binary it maps to, e.g. an emulator's in place of a GPU's"""
    bindir = os.path.join(D, name)
    os.makedirs(bindir)
    for link, target in links.items():
        if not os.path.exists(target):
            fail(f"{target} is not built")
        os.symlink(target, os.path.join(bindir, link))
    return bindir


def bench_kernel_attention():
    bindir = bin_dir("bin", {"attention_bench": os.path.join(BUILD, "tests", "attention_bench_emu")})
    out = os.path.join(D, "attention")
    e = env()
    e.update(GPTC_BUILD=bindir, GPTC_BENCH_OUT=out, GPTC_BENCH_ATTN_SHAPES="1x70x2x64",
             GPTC_BENCH_ATTN_WARMUP="1", GPTC_BENCH_ATTN_ITERS="1", GPTC_BENCH_ATTN_BUDGET_S="200")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu",
                                                     "bench_kernel_attention.py")],
                       capture_output=True, text=True, env=e, timeout=300)
    if r.returncode:
        fail(f"bench_kernel_attention: exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    ran = {(row["impl"], row["precision"], row["direction"])
           for row in rows_of(os.path.join(out, "attention.jsonl")) if "ms" in row}
    for impl in ("gptc", "gptc-plain", "gptc-rows64", "gptc-pipelined", "gptc-biaspass",
                 "gptc-biasfused", "gptc-dqfused", "gptc-dqatomic", "gptc-wide"):
        for d in ("forward", "backward", "forward+backward"):
            if (impl, "bf16", d) not in ran:
                fail(f"bench_kernel_attention: no {impl} bf16 {d} row")
    table = open(os.path.join(out, "attention.md")).read()
    for col in ("| pipelined ms |", "| wide ms |", "| dq atomic ms |"):
        if col not in table:
            fail(f"bench_kernel_attention: the table has no '{col}' column")
    print(f"ok   bench_kernel_attention on the emulator: {len(ran)} gptc rows, every variant")


def bench_contention():
    """bench_contention.py on the CUDA emulator (gptc-train-emu as the build's gptc-train,
    its fake CUPTI on, a 1-layer model): both time-sliced sections with their kernel and
    device-kernel tables, the latter holding compute ops' kernels alone (the staged
    all-reduce's flag kernels had been listed as compute slowed 206x to 406x beside
    communication on an H200)"""
    bindir = bin_dir("bin_contention", {"gptc-train": os.path.join(BUILD, "tests", "gptc-train-emu"),
                                        "gptc-data": os.path.join(BUILD, "gptc-data")})
    out = os.path.join(D, "contention")
    e = env(2)
    e.update(GPTC_BUILD=bindir, GPTC_BENCH_OUT=out, GPTC_EMU_CUPTI="1", GPTC_BENCH_MPS="0",
             GPTC_BENCH_EXTRA="--train.device=cuda --model.n_layer=1 --model.d_model=64 "
                              "--model.n_head=2 --model.vocab_size=256 --train.seq_len=32 "
                              "--model.n_ctx=32 --overlap.dp_bucket_mb=0.01")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu",
                                                     "bench_contention.py")],
                       capture_output=True, text=True, env=e, timeout=300)
    if r.returncode:
        fail(f"bench_contention: exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    text = open(os.path.join(out, "contention.md")).read()
    sections = text.split("\n## ")[1:]
    if [s.split("\n")[0] for s in sections] != ["dp = none, time-sliced", "dp = bucket, time-sliced"]:
        fail(f"bench_contention: sections {[s.split(chr(10))[0] for s in sections]}")
    bucket = sections[1]
    if "mpi with host staging" not in bucket or "| allreduce | " not in bucket:
        fail(f"bench_contention: the bucket section has no staged all-reduce:\n{bucket[:1500]}")
    if "Device kernels behind them" not in bucket:
        fail(f"bench_contention: no device-kernel table in the bucket section:\n{bucket[-1500:]}")
    comm_ops = {k["name"] for k in json.load(open(os.path.join(out, "report_bucket.json")))["kernels"]
                if k["kind"] == "comm"}
    dev_rows = [ln.split("|")[1:3] for s in sections if "Device kernels behind them" in s
                for ln in s.split("Device kernels behind them")[1].splitlines()
                if ln.startswith("| ") and "`" in ln]
    wrong = [row for row in dev_rows if row[0].strip() in comm_ops | {"(none)"} or "flag" in row[1]]
    if not dev_rows or wrong:
        fail(f"bench_contention: device-kernel rows of communication or outside the ops: {wrong} "
             f"({len(dev_rows)} rows)")
    print(f"ok   bench_contention on the emulator: both sections, {len(dev_rows)} device-kernel "
          f"rows, all of compute ops")


def cpu_bench_settings():
    py = "/usr/bin/python3"
    cases = [  # (command, extra environment, words of the one line)
        # every measured step a probe step: the sweep ran, then its plots crashed
        ([py, "benchmarks/overlap_sweep.py", "--steps", "4", "--contention-probe", "1"], {},
         ["--contention-probe 1", "every measured step"]),
        # a global batch of 8 over 3 ranks: gptc refused it, the script raised
        ([py, "benchmarks/timing_overhead.py", "--ranks", "3"], {}, ["--ranks 3"]),
        # 2 steps: no median, and the rss landed in the tokens/s column
        (["bash", "benchmarks/cpu_throughput.sh"], {"STEPS": "2"}, ["STEPS=2", "3 or more"]),
    ]
    for cmd, extra, words in cases:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60,
                           env=dict(env(), **extra))
        last = r.stderr.strip().splitlines()[-1:] or [""]
        if r.returncode != 2 or "Traceback" in r.stderr or not all(w in last[0] for w in words):
            fail(f"{' '.join(cmd[1:])} {extra}: exit {r.returncode}, {r.stderr[-600:]!r}")
    print("ok   the CPU benchmarks refuse settings they cannot measure, in one line")


def overlap_sweep():
    """benchmarks/overlap_sweep.py on its smallest matrix (tiny model, dp2, both policies):
    every CSV cell a plain value (the run's per-parallelism summary had gone in as a
    Python dict's repr), each parallelism's summary in columns of its own, the plots drawn"""
    import csv
    out = os.path.join(D, "sweep")
    e = dict(env(), GPTC_BUILD=BUILD)
    r = subprocess.run(["/usr/bin/python3", "benchmarks/overlap_sweep.py", "--models", "tiny",
                        "--layouts", "dp2", "--timeline-layout", "dp2", "--steps", "3",
                        "--repeats", "1", "--max-wait-s", "0", "--out", out],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=e)
    if r.returncode:
        fail(f"overlap_sweep: exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    for name in ("overlap_sweep.csv", "overlap_sweep_kernels.csv"):
        with open(os.path.join(out, name), newline="") as f:
            rows = list(csv.DictReader(f))
        if len({row["policy"] for row in rows}) < 2:
            fail(f"overlap_sweep: {name} holds {len(rows)} rows of fewer than 2 policies")
        for row in rows:
            nested = [k for k, v in row.items() if v and v.lstrip()[:1] in "{["]
            if nested:
                fail(f"overlap_sweep: {name} has nested values in {nested}")
            for k in ("run_iter_ms", "run_dp_comm_ms", "run_dp_exposed_comm_ms"):
                try:
                    float(row[k])
                except (KeyError, ValueError):
                    fail(f"overlap_sweep: {name}: column {k} missing or not a number: {row.get(k)!r}")
    for png in ("step_time.png", "comm_hidden.png", "timeline.png", "kernel_slowdown_tiny.png"):
        if not os.path.getsize(os.path.join(out, png)):
            fail(f"overlap_sweep: {png} is empty")
    print("ok   overlap_sweep.py: flat CSV columns (run_dp_comm_ms, ...), its plots drawn")


def main():
    cpu_bench_settings()
    overlap_sweep()
    bench_gpt2()
    bench_gpt2_issue()
    bench_kernel_attention()
    bench_contention()
    print("PASS: the GPU benchmarks' scripts run end to end")


if __name__ == "__main__":
    main()
