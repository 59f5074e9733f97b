"""A GPU training run equals the CPU run: the tiny GPT-2 of test_layouts (4 layers,
d_model 64, 4 heads, vocab 251 so that the padded vocabulary is exercised) for 5 steps,
fp32, on one rank and on multi-rank layouts sharing the one GPU (which run on NCCL when it
allows several ranks per GPU, else on MPI with host staging). Losses and grad norms must
match the single-rank CPU run to 1e-4 relative; the final checkpoints' parameters too.
Exits 77 (skipped) when no GPU is visible."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import (compare_bf16_run, compare_metrics, compare_params, fail,  # noqa: E402
                          gpu_present, work_dir, train_tiny, write_tokens)

RTOL = 1e-4
D = work_dir("gptc_cuda_train_")
VOCAB = 251


STDOUT = {}


def train(name, ranks, device, extra, extra_env=None):
    metrics, r, _ = train_tiny(D, name, ranks, device, extra, 5, VOCAB, extra_env=extra_env,
                               refused=(), timeout=600)
    STDOUT[name] = r.stdout
    for line in r.stdout.splitlines():
        if line.startswith("backend:") or line.startswith("overlap policies") or \
                line.startswith("kernel timing:"):
            print(f"     {name}: {line}")
    return metrics


def check_device_kernels(rep, cupti):
    """The report's device_kernels: with CUPTI, every compute op timed has kernels whose
    time fits in the op's, named as kernel_name names them (not mangled), the attention's
    among them; with CUDA events, none."""
    dev = rep["device_kernels"]
    if not cupti:
        if dev:
            fail(f"device_kernels from CUDA events: {dev[:3]}")
        return 0
    by_op = {}
    for d in dev:
        by_op.setdefault(d["op"], []).append(d)
        if d["kernel"].startswith("_Z") or not d["count"] > 0 or not d["mean_us"] > 0:
            fail(f"device kernel {d}: mangled, or no count or time")
    for k in rep["kernels"]:
        if k["kind"] != "compute" or not k["count"]:
            continue
        busy = sum(d["total_us_per_step"] for d in by_op.get(k["name"], []))
        if not 0 < busy <= k["total_us_per_step"] * 1.001 + 0.01:
            fail(f"op {k['name']}: its kernels take {busy:.1f} us a step, the op "
                 f"{k['total_us_per_step']:.1f}: {by_op.get(k['name'])}")
    if not any(d["kernel"].startswith("attention_") for d in by_op.get("attention_fwd", [])):
        fail(f"attention_fwd's kernels: {by_op.get('attention_fwd')}")
    return len(dev)


def compare(name, key, ref, got):
    worst = compare_metrics(name, ref, got, RTOL, "CPU")
    compare_params(name, f"{D}/cpu.h5", f"{D}/{key}.h5", RTOL, 1e-3)
    print(f"ok   {name:<36} worst relative difference {worst:.2e}")


LAYOUTS = [
    ("cuda", 1, []),
    ("cuda dp2", 2, ["--parallel.dp=2"]),
    ("cuda tp2", 2, ["--parallel.tp=2"]),
    ("cuda pp2 1f1b", 2, ["--parallel.pp=2"]),
    ("cuda tp2 x pp2 x dp2 bucket", 8, ["--parallel.tp=2", "--parallel.pp=2", "--parallel.dp=2",
                                        "--overlap.dp=bucket", "--overlap.dp_bucket_mb=0.01"]),
    ("cuda dp2 ZeRO-1 bucket", 2, ["--parallel.dp=2", "--overlap.dp=bucket",
                                   "--overlap.dp_shard=optimizer", "--overlap.dp_bucket_mb=0.01"]),
    ("cuda tp2 SP chunked", 2, ["--parallel.tp=2", "--parallel.sequence_parallel=true",
                                "--overlap.tp=chunked"]),
    ("cuda pp2 interleaved async", 2, ["--parallel.pp=2", "--parallel.schedule=interleaved",
                                       "--parallel.virtual_stages=2", "--overlap.pp=async"]),
]


def main():
    if not gpu_present():
        print("skipped: no GPU visible (test_cuda_train needs one)")
        sys.exit(77)
    rng = np.random.default_rng(7)
    write_tokens(f"{D}/tok.h5", rng.integers(0, VOCAB, 4000), VOCAB)
    ref = train("cpu", 1, "cpu", [])
    for name, ranks, extra in LAYOUTS:
        key = name.replace(" ", "_")
        compare(name, key, ref, train(key, ranks, "cuda", extra))
    # the host-staged MPI path, whichever the machine would pick
    for name, ranks, extra in [l for l in LAYOUTS if l[0] in ("cuda tp2 x pp2 x dp2 bucket",
                                                           "cuda pp2 interleaved async")]:
        key = name.replace(" ", "_") + "_staged"
        compare(name + " (staged)", key, ref, train(key, ranks, "cuda", extra, {"GPTC_COMM": "mpi"}))
    # precision = bf16: bf16 storage, cuBLASLt's bf16 products and the tensor-core
    # attention against the CPU's bf16 run of the same layout (TP rounds its partial sums,
    # so layouts differ by more than devices do; gptc_testlib.compare_bf16_run says what
    # must hold and why) (head size 64, the kernels GPT-2 runs)
    h64 = ["--model.d_model=128", "--model.n_head=2"]
    for name, ranks, extra in [("cuda bf16", 1, []), ("cuda bf16 tp2 x dp2", 4,
                                                      ["--parallel.tp=2", "--parallel.dp=2"])]:
        bf16 = h64 + ["--train.precision=bf16"] + extra
        key = name.replace(" ", "_")
        ref_bf16 = train("cpu_" + key, ranks, "cpu", bf16)
        got = train(key, ranks, "cuda", bf16)
        print(f"ok   {name:<36} within {compare_bf16_run(name, ref_bf16, got):.2e} of the CPU's bf16 run")
    # head size 32 (configs/tiny.ini's): the kernels that take the head size at run time
    hs32 = ["--model.n_head=2", "--train.precision=bf16"]
    ref_bf16 = train("cpu_bf16_hs32", 1, "cpu", hs32)
    got = train("cuda_bf16_hs32", 1, "cuda", hs32)
    print(f"ok   {'cuda bf16 hs32':<36} within {compare_bf16_run('cuda bf16 hs32', ref_bf16, got):.2e} "
          f"of the CPU's bf16 run")
    # kernel timing with CUDA events, and NVML power: the same losses, and a report that
    # holds every op with a positive device time and every step with its GPU readings
    import json
    timed = ["--profile.timing=kernel", f"--profile.report={D}/report.json",
             f"--profile.trace={D}/trace.json", "--profile.power=true"]
    got = train("cuda_timed", 2, "cuda", ["--parallel.dp=2", "--overlap.dp=bucket"] + timed)
    compare("cuda dp2 timed + power", "cuda_timed", ref, got)
    for m in got:
        for k in ("energy_j", "power_w", "sm_clock_mhz"):
            if not (isinstance(m.get(k), (int, float)) and m[k] > 0):
                fail(f"metrics of step {m['step']}: {k} = {m.get(k)!r}, expected > 0")
    rep = json.load(open(f"{D}/report.json"))
    names = {k["name"]: k for k in rep["kernels"]}
    for op in ("attention_fwd", "attention_bwd", "qkv_fwd", "layernorm_fwd", "add_layernorm_fwd", "adamw",
               "allreduce"):
        if op not in names or not names[op]["count"] > 0 or not names[op]["mean_us"] > 0:
            fail(f"report: {op} missing or without time: {names.get(op)}")
    for st in rep["steps"]:
        if not (st["compute_ms"] > 0 and st["comm_ms"] > 0 and st["iter_ms"] >= st["compute_ms"] * 0.5):
            fail(f"report step {st}: implausible times")
        if not st.get("power_w", 0) > 0:
            fail(f"report step {st}: no power reading")
    trace = json.load(open(f"{D}/trace.json"))["traceEvents"]
    if not any(e.get("cat") == "comm" for e in trace):
        fail("trace: no communication events")
    n_dev = check_device_kernels(rep, "kernel timing: CUPTI" in STDOUT["cuda_timed"])
    print(f"ok   kernel timing: {len(names)} op names, {len(rep['steps'])} step entries with power, "
          f"{n_dev} (op, device kernel) pairs")
    print(f"PASS: {len(LAYOUTS) + 5} GPU runs match the CPU run")


if __name__ == "__main__":
    main()
