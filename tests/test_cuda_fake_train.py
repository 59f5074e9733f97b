"""The whole CUDA host path without a GPU: gptc-train-emu (the real engine/cuda/*.c op
table, cuBLASLt mapping, host workers and event timer, on the fake CUDA runtime of
tests/cuda_emu, whose kernels are the real .cu files run on the CPU emulator) trains with
--train.device=cuda and must equal the CPU backend's single-rank run of gptc-train: the
tiny GPT-2 of test_cuda_train (4 layers, d_model 64, 4 heads, vocab 251 so that the
padded vocabulary is exercised, T 32, global batch 8 in micro-batches of 2) for 4 steps,
fp32. Losses and grad norms within 1e-5 relative, and the final checkpoints' parameters
within 1e-5 normwise over the whole model (1e-3 per tensor; gptc_testlib.compare_params
says why not element by element): everything is fp32, so the runs differ only in the
order of sums.

On one rank and on multi-rank layouts under mpirun, whose communication is MPI with host
staging (the emulated build has no NCCL) on streams that really run beside the compute:
dp2 ZeRO-1 with bucketed overlap, tp2 with sequence parallelism and chunked overlap, pp2
1f1b and interleaved with async transfers, tp2 resuming from the dp2 run's checkpoint of
step 2 (saved from the device, ZeRO-1 state gathered), and dp2 with kernel timing (CUDA events, the fake CUPTI
refuses to start), the contention probe and NVML power from tests/fake_nvml.c, whose
report must hold every op with a device time; and one rank timed from the fake CUPTI's
activity records (GPTC_EMU_CUPTI=1), through engine/cuda/timer_cupti.c. Then two
refusals, each one line and a nonzero exit: the fp32 attention at hs 128 on a 99 KiB
device, a GPU of compute capability 7.5 (for which the build has no kernels), and a
misspelt GPTC_ATTENTION_DQ, GPTC_TIMER or GPTC_ATTENTION_GROUP, at the start of a 2-rank
run.

    test_cuda_fake_train.py GPTC_TRAIN_EMU FAKE_NVML_SO [--quick]

--quick (the sanitizer builds, where the emulator is several times slower) trains 2 steps
instead of 4.

A wrong row-major -> column-major mapping in engine/cuda/cuda_matmul.c (a transpose flag,
a leading dimension), a missing stream wait in the host code, or a kernel bug changes the
losses far beyond 1e-5."""
import json
import os
import re
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import (compare_bf16_run, compare_metrics, compare_params, fail,  # noqa: E402
                          work_dir, run_train, train_tiny, write_tokens)

RTOL = 1e-5
PARAM_TENSOR_RTOL = 1e-3
STEPS = 2 if "--quick" in sys.argv else 4
RESUME = STEPS // 2  # the step whose checkpoint emu_resume_tp2 goes on from
VOCAB = 251
D = work_dir("gptc_cuda_fake_train_")


def train(name, ranks, device, extra, binary=None, extra_env=None):
    metrics, r, secs = train_tiny(D, name, ranks, device, extra, STEPS, VOCAB, binary, extra_env)
    return metrics, r.stdout, secs


def compare(name, ref, got, first=1):
    """Worst relative difference of the losses and grad norms (steps from first on), and
    the parameters' whole normwise difference; fails beyond the tolerances."""
    worst = compare_metrics(name, [m for m in ref if m["step"] >= first], got, RTOL, "CPU")
    return worst, compare_params(name, f"{D}/cpu.h5", f"{D}/{name}.h5", RTOL, PARAM_TENSOR_RTOL)


LAYOUTS = [
    ("emu", 1, []),
    # also keeps the checkpoint of step RESUME, which emu_resume_tp2 below goes on from
    ("emu_dp2_zero1_bucket", 2, ["--parallel.dp=2", "--overlap.dp=bucket",
                                 "--overlap.dp_shard=optimizer", "--overlap.dp_bucket_mb=0.05",
                                 f"--train.save_every={RESUME}", f"--train.keep={STEPS}"]),
    ("emu_tp2_sp_chunked", 2, ["--parallel.tp=2", "--parallel.sequence_parallel=true",
                               "--overlap.tp=chunked", "--overlap.tp_chunks=2"]),
    # with cuBLASLt's candidates timed at each product's first call (cuda_matmul.c), the
    # first of them slow: stage 1 blocks on its stream for the timings while its inputs
    # still come from stage 0
    ("emu_pp2_1f1b_async", 2, ["--parallel.pp=2", "--parallel.schedule=1f1b",
                               "--overlap.pp=async", "--overlap.comm_priority=high"],
     {"GPTC_GEMM_CANDIDATES": "3", "GPTC_EMU_LT_CANDIDATES": "3", "GPTC_EMU_LT_SLOW_FIRST": "1"}),
    ("emu_pp2_interleaved", 2, ["--parallel.pp=2", "--parallel.schedule=interleaved",
                                "--parallel.virtual_stages=2", "--overlap.pp=async"]),
]


def main():
    args = [a for a in sys.argv[1:] if a != "--quick"]
    if len(args) != 2:
        fail("usage: test_cuda_fake_train.py GPTC_TRAIN_EMU FAKE_NVML_SO [--quick]")
    emu, nvml = args
    rng = np.random.default_rng(7)
    write_tokens(f"{D}/tok.h5", rng.integers(0, VOCAB, 4000), VOCAB)
    ref, _, _ = train("cpu", 1, "cpu", [])
    for name, ranks, extra, *env in LAYOUTS:
        got, out, secs = train(name, ranks, "cuda", extra, binary=emu,
                               extra_env=env[0] if env else None)
        if "communication: mpi with host staging" not in out:
            fail(f"{name}: expected the CUDA backend with MPI on host staging:\n{out[-2000:]}")
        if env and not re.search(r"candidate [23] of 3 is the fastest", out):
            fail(f"{name}: no product timed its cuBLASLt candidates:\n{out[-2000:]}")
        worst, perr = compare(name, ref, got)
        print(f"ok   {name:<24} {ranks} rank(s): losses, grad norms within {worst:.1e}, "
              f"parameters {perr:.1e} ({secs:.1f} s)")

    # a checkpoint written on the device under ZeRO-1 (parameters and the optimizer state
    # gathered from the shards) goes on under tensor parallelism: the later steps as the CPU's
    name = "emu_resume_tp2"
    got, out, secs = train(name, 2, "cuda", ["--parallel.tp=2",
                                             f"--train.init={D}/emu_dp2_zero1_bucket.step{RESUME}.h5"],
                           binary=emu)
    if len(got) != STEPS - RESUME:
        fail(f"{name}: {len(got)} steps logged, expected {STEPS - RESUME}")
    worst, perr = compare(name, ref, got, first=RESUME + 1)
    print(f"ok   {name:<24} 2 rank(s): losses, grad norms within {worst:.1e}, parameters "
          f"{perr:.1e} ({secs:.1f} s), from the dp2 ZeRO-1 run's step-{RESUME} checkpoint")

    # precision = bf16: cuda_matmul.c asks cuBLASLt for bf16 operands (the fake rounds them
    # as the CPU does) and the tensor-core attention kernels run on the emulator; tp2 so
    # that the products of both shards and the comm are in it
    # head size 64, the kernels GPT-2 runs (the others are test_cuda_ops')
    h64 = ["--model.d_model=128", "--model.n_head=2"]
    # Each against the CPU's bf16 run of the same layout: TP rounds its partial sums, so
    # layouts differ by more than devices do (test_bf16)
    # tp2 with the attention variants not on by default: the pipelined forward and dq from
    # the dk/dv kernel, with the qkv bias added by the kernels (the default, named), in
    # training
    variants = {"GPTC_ATTENTION_FWD": "pipelined", "GPTC_ATTENTION_DQ": "fused",
                "GPTC_ATTENTION_BIAS": "1"}
    # and one rank with dq added by atomics, the forward in flash attention 2's shape and
    # the qkv bias by a pass (the default before an H100 run), against the same CPU run as
    # the first
    bf16_runs = [("emu_bf16", 1, [], None,
                  "forward rows128, dq by its own kernel, qkv bias by the kernels"),
                 ("emu_bf16_tp2", 2, ["--parallel.tp=2"], variants,
                  "forward pipelined, dq from the dk/dv kernel, qkv bias by the kernels"),
                 ("emu_bf16_wide_dq_atomic", 1, [],
                  {"GPTC_ATTENTION_DQ": "atomic", "GPTC_ATTENTION_FWD": "wide",
                   "GPTC_ATTENTION_BIAS": "0"},
                  "forward wide, dq from the dk/dv kernel by atomics, qkv bias by a pass")]
    if "--quick" in sys.argv:
        bf16_runs = bf16_runs[:1]
    refs = {}  # the CPU's bf16 runs by layout
    for name, ranks, extra, env_extra, kernels in bf16_runs:
        bf16 = h64 + ["--train.precision=bf16"] + extra
        if (ranks, tuple(extra)) not in refs:
            refs[(ranks, tuple(extra))], _, _ = train("cpu_" + name, ranks, "cpu", bf16)
        ref_bf16 = refs[(ranks, tuple(extra))]
        got, out, secs = train(name, ranks, "cuda", bf16, binary=emu, extra_env=env_extra)
        # the start-up line names the attention kernels that run
        line = f"attention kernels (bf16, head size 64): {kernels}"
        if line not in out:
            fail(f"{name}: no start-up line '{line}'")
        worst = compare_bf16_run(name, ref_bf16, got)
        print(f"ok   {name:<24} {ranks} rank(s): within {worst:.1e} of the CPU's bf16 run ({secs:.1f} s)")

    # kernel timing on CUDA events (the fake CUPTI refuses, as when a profiler holds it),
    # a contention probe every 2nd step, and power from the fake NVML: the same numbers,
    # and a report holding every op with a device time and every step with its readings
    name = "emu_dp2_timed"
    timed = ["--parallel.dp=2", "--overlap.dp=bucket", "--overlap.dp_bucket_mb=0.05",
             "--profile.timing=kernel", f"--profile.report={D}/report.json",
             f"--profile.trace={D}/trace.json", "--profile.contention_probe=2",
             "--profile.power=true"]
    got, out, secs = train(name, 2, "cuda", timed, binary=emu, extra_env={"GPTC_NVML_PATH": nvml})
    if "kernel timing: CUDA events around each op" not in out:
        fail(f"{name}: the CUDA-event timer did not start:\n{out[-2000:]}")
    worst, perr = compare(name, ref, got)
    for m in got:
        for k in ("energy_j", "power_w", "sm_clock_mhz"):
            if not (isinstance(m.get(k), (int, float)) and m[k] > 0):
                fail(f"{name}: metrics of step {m['step']}: {k} = {m.get(k)!r}, expected > 0")
        # the fake's readings (tests/fake_nvml.c): its energy counter moves 1000 mJ a
        # reading, read at a step's start and end; the clock 1980 MHz; the power the energy
        # over the readings' interval, which holds the step's iter_ms (a column written
        # under another's name passed the > 0 above)
        most_w = 1.0 / ((m["iter_ms"] - 0.0005) * 1e-3) + 0.0005  # both printed to 3 decimals
        if m["energy_j"] != 1.0 or m["sm_clock_mhz"] != 1980 or not m["power_w"] <= most_w:
            fail(f"{name}: metrics of step {m['step']}: energy_j {m['energy_j']}, power_w "
                 f"{m['power_w']}, sm_clock_mhz {m['sm_clock_mhz']}; the fake NVML gives 1.0 J "
                 f"a step, at most {most_w:.3f} W over its {m['iter_ms']} ms, 1980 MHz")
    rep = json.load(open(f"{D}/report.json"))
    names = {k["name"]: k for k in rep["kernels"]}
    for op in ("embedding_fwd", "layernorm_fwd", "add_layernorm_fwd", "qkv_fwd", "attention_fwd",
               "attention_bwd", "fc_bwd", "lm_head_fwd", "loss", "grad_norm", "adamw", "zero",
               "allreduce"):
        k = names.get(op)
        if not k or not k["count"] > 0 or not k["mean_us"] > 0:
            fail(f"{name}: report: {op} missing or without time: {k}")
    probes = [s for s in rep["steps"] if s.get("probe")]
    if len(rep["steps"]) != 2 * STEPS or len(probes) != 2 * (STEPS // 2):  # 2 ranks
        fail(f"{name}: report steps {rep['steps']}")
    for st in rep["steps"]:
        if not (st["compute_ms"] > 0 and st["comm_ms"] > 0 and st["iter_ms"] >= st["compute_ms"] * 0.5):
            fail(f"{name}: report step {st}: implausible times")
        if not st.get("power_w", 0) > 0:
            fail(f"{name}: report step {st}: no power reading")
    if rep["device_kernels"] or "device kernels behind each op" in out:
        fail(f"{name}: device kernels from a timer that cannot see them: {rep['device_kernels']}")
    trace = json.load(open(f"{D}/trace.json"))["traceEvents"]
    if not any(e.get("cat") == "comm" for e in trace):
        fail(f"{name}: trace: no communication events")
    print(f"ok   {name:<24} 2 rank(s): losses, grad norms within {worst:.1e}, parameters "
          f"{perr:.1e} ({secs:.1f} s); report: {len(names)} op names timed on CUDA events, "
          f"power on every step")

    # the same with CUPTI (GPTC_EMU_CUPTI=1 lets the fake start): timer_cupti.c joins the
    # activity records of each op's kernels, copies and sets to the op through the
    # external correlation ids it pushed around the op's launches
    name = "emu_cupti_timed"
    got, out, secs = train(name, 1, "cuda", ["--profile.timing=kernel",
                                             f"--profile.report={D}/report_cupti.json"],
                           binary=emu, extra_env={"GPTC_EMU_CUPTI": "1"})
    if "kernel timing: CUPTI activity records" not in out:
        fail(f"{name}: the CUPTI timer did not start:\n{out[-2000:]}")
    worst, perr = compare(name, ref, got)
    rep = json.load(open(f"{D}/report_cupti.json"))
    cupti_names = {k["name"]: k for k in rep["kernels"]}
    for op in names:  # every compute op the event timer saw
        k = cupti_names.get(op)
        if names[op]["kind"] == "compute" and (not k or not k["count"] > 0 or not k["mean_us"] > 0):
            fail(f"{name}: report: {op} missing or without time: {k}")
    for st in rep["steps"]:
        if not (0 < st["compute_ms"] <= st["iter_ms"] * 1.05):
            fail(f"{name}: report step {st}: implausible times")
    n_dev = check_device_kernels(name, rep)
    if "device kernels behind each op" not in out:
        fail(f"{name}: no device kernel table on stdout:\n{out[-2000:]}")
    print(f"ok   {name:<24} 1 rank(s): losses, grad norms within {worst:.1e}, parameters "
          f"{perr:.1e} ({secs:.1f} s); report: {len(cupti_names)} op names timed from CUPTI records, "
          f"{n_dev} (op, device kernel) pairs")

    # two ranks over MPI with host staging, timed by CUPTI: each staged all-reduce's device
    # work (its two copies, and per host task a set and a wait flag kernel: two tasks a
    # call) is the all-reduce's, not work outside every op counted as compute (an H200 run
    # showed the wait kernel, which spins while MPI runs, as a compute kernel 206x to 406x
    # slower beside communication)
    name = "emu_cupti_dp2_staged"
    got, out, secs = train(name, 2, "cuda", ["--parallel.dp=2", "--overlap.dp=bucket",
                                             "--overlap.dp_bucket_mb=0.05", "--profile.timing=kernel",
                                             f"--profile.report={D}/report_staged.json"],
                           binary=emu, extra_env={"GPTC_EMU_CUPTI": "1"})
    if "mpi with host staging" not in out or "kernel timing: CUPTI activity records" not in out:
        fail(f"{name}: not a staged run timed by CUPTI:\n{out[-2000:]}")
    worst, perr = compare(name, ref, got)
    dev = json.load(open(f"{D}/report_staged.json"))["device_kernels"]
    outside = [d for d in dev if d["op"] == "(none)" and "flag" in d["kernel"]]
    if outside:
        fail(f"{name}: host staging's flag kernels counted outside every op: {outside}")
    staged = {d["kernel"]: d for d in dev if d["op"] == "allreduce"}
    for kernel in ("wait_flag_kernel", "set_flag_kernel", "memcpy"):
        if staged.get(kernel, {}).get("per_op_call") != 2.0:
            fail(f"{name}: allreduce's {kernel}: want 2 a call, got {staged.get(kernel)}")
    print(f"ok   {name:<24} 2 rank(s): losses, grad norms within {worst:.1e}, parameters "
          f"{perr:.1e} ({secs:.1f} s); the staged all-reduce's copies and flag kernels are its own")

    # a CUPTI that fails part-way through its start (an activity kind it refuses): CUDA
    # events time the run, and what had been switched on is off again (the fake says so at
    # exit of a kind left on and never read, which train_tiny fails on)
    name = "emu_cupti_fails"
    got, out, secs = train(name, 1, "cuda", ["--profile.timing=kernel"], binary=emu,
                           extra_env={"GPTC_EMU_CUPTI": "runtime_fails"})
    if "kernel timing: CUDA events around each op (CUPTI: cuptiActivityEnable" not in out:
        fail(f"{name}: the run did not fall back to CUDA events:\n{out[-2000:]}")
    worst, perr = compare(name, ref, got)
    print(f"ok   {name:<24} 1 rank(s): CUPTI refused a kind, CUDA events timed the run; "
          f"losses within {worst:.1e} ({secs:.1f} s)")

    # the same with cuBLASLt's candidates timed at each product's first call: those calls'
    # ops hold every candidate's runs, so they must be read as untimed: at least one op,
    # at most one per product (an op may run two products, as the backward's dinp and dw;
    # test_cuda_ops_emu_candidates checks one op exactly)
    name = "emu_cupti_candidates"
    got, out, secs = train(name, 1, "cuda", ["--profile.timing=kernel",
                                             f"--profile.report={D}/report_cand.json"],
                           binary=emu, extra_env={"GPTC_EMU_CUPTI": "1", "GPTC_GEMM_CANDIDATES": "3",
                                                  "GPTC_EMU_LT_CANDIDATES": "3"})
    worst, perr = compare(name, ref, got)
    tuned = len(re.findall(r"candidate \d of 3 is the fastest", out))
    plain_untimed = rep["untimed_records"]["compute"]
    rep_cand = json.load(open(f"{D}/report_cand.json"))
    untimed = rep_cand["untimed_records"]["compute"]
    check_device_kernels(name, rep_cand)
    check_compare_devices(f"{D}/report_cupti.json", f"{D}/report_cand.json", rep, rep_cand)
    if tuned == 0 or not plain_untimed < untimed <= plain_untimed + tuned:
        fail(f"{name}: {tuned} products timed their candidates, {untimed} compute records "
             f"untimed, {plain_untimed} without candidates: want 1 to {tuned} more")
    print(f"ok   {name:<24} 1 rank(s): losses, grad norms within {worst:.1e}, parameters "
          f"{perr:.1e} ({secs:.1f} s); {tuned} products timed their candidates in "
          f"{untimed - plain_untimed} ops, left untimed")
    check_small_smem_refusal(emu)
    check_old_gpu_refusal(emu)
    check_variable_refusals(emu)
    print(f"PASS: {len(LAYOUTS) + 5 + len(bf16_runs)} runs of the CUDA host code on the fake runtime match the CPU run")


# the kernels the fake cuBLASLt names its products by (tests/cuda_emu/fake_cublaslt.c), and
# how many each op runs: one product a forward, two a backward (dinp and dw)
EXPECT_DEVICE = {("fc_gelu_fwd", "emu_gemm_gelu_aux"): 1.0, ("fc_proj_dgelu_bwd", "emu_gemm_dgelu"): 1.0,
                 ("qkv_fwd", "emu_gemm_bias"): 1.0, ("lm_head_fwd", "emu_gemm"): 1.0,
                 ("fc_bwd", "emu_gemm"): 2.0, ("attn_proj_bwd", "emu_gemm"): 2.0}


def check_compare_devices(a, b, ra, rb):
    """tools/compare_reports.py on two reports with device kernels: their table, each
    (op, kernel) pair's time per step as each report gives it"""
    tool = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools",
                        "compare_reports.py")
    r = subprocess.run([sys.executable, tool, a, b, "--top", "1000"], capture_output=True,
                       text=True)
    if r.returncode or "Device kernels behind the ops" not in r.stdout:
        fail(f"compare_reports on CUPTI reports: exit {r.returncode}, no device kernel table\n"
             f"{r.stdout[-800:]}{r.stderr[-800:]}")
    rows = {}
    for ln in r.stdout.split("Device kernels behind the ops")[1].splitlines():
        c = [x.strip() for x in ln.split("|")[1:-1]]
        if len(c) == 7 and c[1].startswith("`"):
            rows[(c[0], c[1].strip("`"))] = c[2:4]
    for rep, col in ((ra, 0), (rb, 1)):
        for d in rep["device_kernels"]:
            got = rows.get((d["op"], d["kernel"]), ["", ""])[col]
            if got != f"{d['total_us_per_step']:.1f}":
                fail(f"compare_reports: {d['op']} {d['kernel']}: {got!r} us a step, the report "
                     f"{d['total_us_per_step']:.1f}")
    print(f"ok   tools/compare_reports.py: {len(rows)} (op, kernel) pairs of two CUPTI reports "
          f"side by side, as the reports give them")


def check_device_kernels(name, rep):
    """The report's device_kernels from CUPTI records: every compute op timed has its
    kernels, whose time fits inside the op's; the products' kernels at their counts per call
    (an op whose time was spoiled, as by cuBLASLt candidates, must take its kernels out with
    it); demangled names; more than one kernel where an op launches several."""
    dev = rep["device_kernels"]
    if not dev:
        fail(f"{name}: report: no device_kernels from the CUPTI records")
    by_op = {}
    for d in dev:
        by_op.setdefault(d["op"], []).append(d)
        if d["kernel"].startswith("_Z") or not d["count"] > 0:
            fail(f"{name}: device kernel {d}: mangled name or no count")
        # one rank, no communication: every instance ran alone
        if d["overlapped_mean_us"] is not None or d["slowdown"] is not None or \
                abs(d["isolated_mean_us"] - d["mean_us"]) > 1e-3 * d["mean_us"] + 1e-3:
            fail(f"{name}: device kernel {d}: overlapped, or isolated != mean, on one rank")
    for k in rep["kernels"]:
        if k["kind"] != "compute" or not k["count"]:
            continue
        mine = by_op.get(k["name"])
        if not mine:
            fail(f"{name}: op {k['name']} has no device kernels")
        busy = sum(d["total_us_per_step"] for d in mine)
        if busy > k["total_us_per_step"] * 1.001 + 0.01:
            fail(f"{name}: op {k['name']}: its kernels take {busy:.1f} us a step, more than "
                 f"the op's {k['total_us_per_step']:.1f}")
    for (op, kernel), per_call in EXPECT_DEVICE.items():
        got = [d for d in by_op.get(op, []) if d["kernel"] == kernel]
        if len(got) != 1 or got[0]["per_op_call"] != per_call:
            fail(f"{name}: {op}'s {kernel}: want {per_call} a call, got {got} of {by_op.get(op)}")
    if len({d["kernel"] for d in by_op.get("attention_bwd", [])}) < 2:
        fail(f"{name}: attention_bwd's kernels: {by_op.get('attention_bwd')}")
    return len(dev)


def check_start_refusal(emu, name, what, d_model, extra_env, want):
    """A fake GPU the model cannot run on (extra_env makes it so): both ranks of a dp2 job
    stop at the start, before any step, with one error line holding every word of want
    (not a bare launch error at the first kernel)."""
    args = ["--model.n_layer=1", "--model.n_head=1", f"--model.d_model={d_model}",
            "--model.n_ctx=32", f"--model.vocab_size={VOCAB}", f"--data.path={D}/tok.h5",
            "--train.steps=1", "--train.global_batch=2", "--train.seq_len=32",
            "--train.device=cuda", "--parallel.dp=2"]
    r = run_train(args, np_ranks=2, train=emu, extra_env=extra_env, timeout=120)
    lines = [x for x in r.stderr.splitlines() if x.startswith("gptc: error:")]
    if r.returncode == 0 or len(lines) != 1 or not all(w in lines[0] for w in want) \
            or re.search(r"^step +\d", r.stdout, re.M):
        fail(f"{what}: exit {r.returncode}, expected one error line with {want} before any "
             f"step:\n{r.stdout[-1000:]}{r.stderr[-2000:]}")
    print(f"ok   {name:<24} 2 rank(s): {lines[0]}")


def check_small_smem_refusal(emu):
    """On a GPU with an sm_89's 99 KiB of shared memory per block, the fp32 attention at
    head size 128 (its backward needs 149.5 KiB) cannot run: the line names the head size's
    keys, what needs how much and that bf16 fits."""
    check_start_refusal(emu, "emu_smem99_refused", "fp32 attention at hs 128 on a 99 KiB device",
                        128, {"GPTC_EMU_SMEM_OPTIN_KB": "99"},
                        ["train.device = cuda", "fp32 attention at head size 128",
                         "model.d_model / model.n_head", "149.5 KiB", "99.0 KiB",
                         "train.precision = bf16 fits"])


def check_old_gpu_refusal(emu):
    """On a GPU that none of the build's architectures runs on (the fake device made a
    compute capability 7.5): the line names the GPU's compute capability and the build's
    architectures."""
    check_start_refusal(emu, "emu_cc75_refused", "a compute capability 7.5 GPU", 64,
                        {"GPTC_EMU_CC": "75"},
                        ["train.device = cuda", "compute capability 7.5",
                         "cannot run this build's kernels", "no kernel image"])


def check_variable_refusals(emu):
    """A variant variable with a value it does not take (a misspelling would otherwise run
    the default kernels without a word): the line names the variable, its value and the
    choices."""
    check_start_refusal(emu, "emu_dq_misspelt", "GPTC_ATTENTION_DQ=atomics", 64,
                        {"GPTC_ATTENTION_DQ": "atomics"},
                        ["GPTC_ATTENTION_DQ = atomics", "kernel, fused, atomic"])
    check_start_refusal(emu, "emu_timer_misspelt", "GPTC_TIMER=event", 64,
                        {"GPTC_TIMER": "event"}, ["GPTC_TIMER = event", "events"])
    check_start_refusal(emu, "emu_comm_misspelt", "GPTC_COMM=MPI", 64, {"GPTC_COMM": "MPI"},
                        ["GPTC_COMM = MPI", "give mpi"])
    check_start_refusal(emu, "emu_group_not_a_count", "GPTC_ATTENTION_GROUP=8k", 64,
                        {"GPTC_ATTENTION_GROUP": "8k"},
                        ["GPTC_ATTENTION_GROUP = 8k", "positive count"])
    # a count of candidates the backend cannot time: refused by name at the start (with a
    # cache named too, which is then no output of the run)
    check_start_refusal(emu, "emu_gemm_candidates_bad", "GPTC_GEMM_CANDIDATES=100", 64,
                        {"GPTC_GEMM_CANDIDATES": "100", "GPTC_GEMM_CACHE": f"{D}/c100.txt"},
                        ["GPTC_GEMM_CANDIDATES = 100", "give a count"])
    # the GEMM cache is appended during the run: a FIFO there hung the start (its open
    # waits for a writer); the run's own metrics file took its lines (the metrics file
    # was then refused as not JSON by every later run)
    os.mkfifo(f"{D}/cache.fifo")
    tune = {"GPTC_GEMM_CANDIDATES": "2", "GPTC_EMU_LT_CANDIDATES": "3"}
    check_start_refusal(emu, "emu_gemm_cache_fifo", "GPTC_GEMM_CACHE a FIFO", 64,
                        dict(tune, GPTC_GEMM_CACHE=f"{D}/cache.fifo"),
                        ["GPTC_GEMM_CACHE", "cache.fifo", "not a regular file"])
    os.remove(f"{D}/cache.fifo")
    log = f"{D}/cache_metrics.jsonl"
    args = ["--model.n_layer=1", "--model.n_head=1", "--model.d_model=64", "--model.n_ctx=32",
            f"--model.vocab_size={VOCAB}", f"--data.path={D}/tok.h5", "--train.steps=1",
            "--train.global_batch=2", "--train.seq_len=32", "--train.device=cuda"]
    r = run_train(args + [f"--train.log_file={log}"], train=emu,
                  extra_env=dict(tune, GPTC_GEMM_CACHE=log), timeout=120)
    if r.returncode == 0 or "train.log_file" not in r.stderr or \
            "GPTC_GEMM_CACHE" not in r.stderr or os.path.exists(log):
        fail(f"GPTC_GEMM_CACHE the metrics file: exit {r.returncode}, {r.stderr[-600:]!r}")
    # without GPTC_GEMM_CANDIDATES the cache is not used: said, not silent, and not a
    # reason to refuse the file it names (here the metrics file, which stays JSON)
    unused = f"{D}/unused_cache.jsonl"
    r = run_train(args + [f"--train.log_file={unused}"], train=emu,
                  extra_env={"GPTC_GEMM_CACHE": unused}, timeout=120)
    if r.returncode or "GPTC_GEMM_CACHE" not in r.stderr or "has no effect" not in r.stderr:
        fail(f"GPTC_GEMM_CACHE without GPTC_GEMM_CANDIDATES: exit {r.returncode}, "
             f"{r.stderr[-600:]!r}")
    with open(unused) as f:
        steps = [json.loads(line)["step"] for line in f]
    if steps != [1]:
        fail(f"GPTC_GEMM_CACHE without GPTC_GEMM_CANDIDATES: metrics steps {steps}")
    print("ok   GPTC_GEMM_CACHE: a FIFO and the metrics file refused, unused said and not refused")


if __name__ == "__main__":
    main()
