"""The NCCL side of the comm layer without a GPU: gptc-train-emu-nccl is gptc-train-emu
(the CUDA host code on the fake CUDA runtime, test_cuda_fake_train) with the real
parallel/comm_nccl.c on the fake NCCL of tests/cuda_emu/fake_nccl.c (MPI underneath, ops
run in stream order on the fake streams; it is not NCCL, its header comment says what it
does not model). NCCL_MULTI_RANK_GPU_ENABLE=1 and the fake's version (2.30) let the comm
layer pick NCCL for two ranks on the one fake GPU, as it would with NCCL 2.30 on one GPU.

On two ranks each run must name nccl on its start-up line, make no call the fake refuses,
issue the NCCL ops its layout needs (the fake counts them: GPTC_FAKE_NCCL_STATS) and equal
the CPU's single-rank run as test_cuda_fake_train's runs do (losses and grad norms within
1e-5, parameters within 1e-5 normwise): tp2 with sequence parallelism and chunked overlap
(all-reduce, reduce-scatter, all-gather, broadcast, reduce), dp2 ZeRO-1 with bucketed
overlap (reduce-scatter, all-gather), pp2 1f1b and interleaved with async transfers
(send, receive); and tp2 under precision = bf16 (ncclBfloat16 collectives) within
compare_bf16_run of the CPU's bf16 tp2 run. With the fake CUPTI on, kernel timing must time
every NCCL op of the tp2 run (none untimed). Without NCCL_MULTI_RANK_GPU_ENABLE the same
binary must fall back to MPI with host staging and issue no NCCL op.

    test_cuda_fake_nccl.py GPTC_TRAIN_EMU_NCCL

(Not run under sanitizers: tests/CMakeLists.txt says why.)"""
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import (compare_bf16_run, compare_metrics, compare_params, fail,  # noqa: E402
                          work_dir, train_tiny, write_tokens)

RTOL = 1e-5
PARAM_TENSOR_RTOL = 1e-3
STEPS = 4
VOCAB = 251
D = work_dir("gptc_cuda_fake_nccl_")
NCCL_ENV = {"NCCL_MULTI_RANK_GPU_ENABLE": "1", "GPTC_FAKE_NCCL_STATS": "1"}
KINDS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "send", "recv")


def train(name, ranks, device, extra, binary=None, extra_env=None, steps=STEPS):
    return train_tiny(D, name, ranks, device, extra, steps, VOCAB, binary, extra_env,
                      refused=("cuda_emu", "fake_nccl:"))


def stats(name, stderr, ranks):
    """Per rank, the fake's op counts: {kind: (all, bf16)}, and its group count."""
    got = {}
    for m in re.finditer(r"fake_nccl stats: rank (\d+):(.*)", stderr):
        ops = {k: (int(a), int(b)) for k, a, b in re.findall(r"(\w+) (\d+) \(bf16 (\d+)\)", m.group(2))}
        got[int(m.group(1))] = ops
    if sorted(got) != list(range(ranks)):
        fail(f"{name}: op counts of ranks {sorted(got)}, expected {ranks}:\n{stderr[-2000:]}")
    return got


def expect_ops(name, counts, kinds, bf16=False):
    for rank, ops in counts.items():
        for k in kinds:
            n, nb = ops.get(k, (0, 0))
            if n == 0 or (bf16 and nb == 0):
                fail(f"{name}: rank {rank} issued {n} {k} ({nb} bf16) through the fake NCCL")


LAYOUTS = [
    ("nccl_tp2_sp_chunked", ["--parallel.tp=2", "--parallel.sequence_parallel=true",
                             "--overlap.tp=chunked", "--overlap.tp_chunks=2"],
     ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")),
    ("nccl_dp2_zero1_bucket", ["--parallel.dp=2", "--overlap.dp=bucket",
                               "--overlap.dp_shard=optimizer", "--overlap.dp_bucket_mb=0.05"],
     ("reduce_scatter", "allgather")),
    ("nccl_pp2_1f1b_async", ["--parallel.pp=2", "--parallel.schedule=1f1b",
                             "--overlap.pp=async", "--overlap.comm_priority=high"],
     ("send", "recv")),
    ("nccl_pp2_interleaved", ["--parallel.pp=2", "--parallel.schedule=interleaved",
                              "--parallel.virtual_stages=2", "--overlap.pp=async"],
     ("send", "recv")),
]


def main():
    args = sys.argv[1:]
    if len(args) != 1:
        fail("usage: test_cuda_fake_nccl.py GPTC_TRAIN_EMU_NCCL")
    emu = args[0]
    rng = np.random.default_rng(7)
    write_tokens(f"{D}/tok.h5", rng.integers(0, VOCAB, 4000), VOCAB)
    ref, _, _ = train("cpu", 1, "cpu", [])
    for name, extra, kinds in LAYOUTS:
        got, r, secs = train(name, 2, "cuda", extra, binary=emu, extra_env=NCCL_ENV)
        if "communication: nccl 2.30.0 (several ranks per GPU)" not in r.stdout:
            fail(f"{name}: expected the comm layer on the fake NCCL:\n{r.stdout[-2000:]}")
        expect_ops(name, stats(name, r.stderr, 2), kinds)
        worst = compare_metrics(name, ref, got, RTOL, "CPU")
        perr = compare_params(name, f"{D}/cpu.h5", f"{D}/{name}.h5", RTOL, PARAM_TENSOR_RTOL)
        print(f"ok   {name:<24} 2 ranks on nccl: losses, grad norms within {worst:.1e}, "
              f"parameters {perr:.1e} ({secs:.1f} s; ops: {', '.join(kinds)})")

    # bf16 activations: the tp collectives go as ncclBfloat16 (head size 64 for the
    # tensor-core attention kernels), against the CPU's bf16 run of the same layout
    name = "nccl_bf16_tp2"
    bf16 = ["--model.d_model=128", "--model.n_head=2", "--train.precision=bf16", "--parallel.tp=2"]
    ref_bf16, _, _ = train("cpu_" + name, 2, "cpu", bf16)
    got, r, secs = train(name, 2, "cuda", bf16, binary=emu, extra_env=NCCL_ENV)
    if "communication: nccl" not in r.stdout:
        fail(f"{name}: expected the comm layer on the fake NCCL:\n{r.stdout[-2000:]}")
    expect_ops(name, stats(name, r.stderr, 2), ("allreduce",), bf16=True)
    worst = compare_bf16_run(name, ref_bf16, got)
    print(f"ok   {name:<24} 2 ranks on nccl: within {worst:.1e} of the CPU's bf16 tp2 run "
          f"({secs:.1f} s)")

    # kernel timing from the fake CUPTI's records, as on a GPU: each NCCL op must be tied to
    # its kernel by the external correlation id pushed around its call, or the report
    # would lack all communication (it says how many records went untimed)
    name = "nccl_tp2_cupti"
    timed = LAYOUTS[0][1] + ["--profile.timing=kernel", f"--profile.report={D}/{name}.json"]
    got, r, secs = train(name, 2, "cuda", timed, binary=emu,
                         extra_env=dict(NCCL_ENV, GPTC_EMU_CUPTI="1"), steps=2)
    if "kernel timing: CUPTI" not in r.stdout:
        fail(f"{name}: expected CUPTI kernel timing:\n{r.stdout[-2000:]}")
    with open(f"{D}/{name}.json") as f:
        report = json.load(f)
    comm = {k["name"]: k["count"] for k in report["kernels"] if k["kind"] == "comm"}
    missing = [k for k in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")
               if not comm.get(k)]
    if missing or report["untimed_records"] != {"compute": 0, "comm": 0}:
        fail(f"{name}: CUPTI timed {comm}, lacks {missing}; untimed {report['untimed_records']}")
    compare_metrics(name, ref[:2], got, RTOL, "CPU")
    print(f"ok   {name:<24} CUPTI times every NCCL op ({secs:.1f} s; {comm})")

    # the same binary without NCCL_MULTI_RANK_GPU_ENABLE: two ranks on one GPU fall back
    name = "staged_dp2"
    got, r, secs = train(name, 2, "cuda", ["--parallel.dp=2"], binary=emu,
                         extra_env={"GPTC_FAKE_NCCL_STATS": "1"}, steps=1)
    if "communication: mpi with host staging: ranks share a GPU" not in r.stdout or \
            "NCCL 2.30.0 has NCCL_MULTI_RANK_GPU_ENABLE unset" not in r.stdout:
        fail(f"{name}: expected the fallback to host-staged MPI:\n{r.stdout[-2000:]}")
    if "fake_nccl stats" in r.stderr:
        fail(f"{name}: NCCL ops issued on the host-staged path:\n{r.stderr[-2000:]}")
    compare_metrics(name, ref[:1], got, RTOL, "CPU")
    print(f"ok   {name:<24} without NCCL_MULTI_RANK_GPU_ENABLE: host-staged MPI, no NCCL op "
          f"({secs:.1f} s)")
    # set, but not to 1 (NCCL's only "on"): the fallback says the value, not "unset"
    got, r, secs = train("staged_true", 2, "cuda", ["--parallel.dp=2"], binary=emu,
                         extra_env={"NCCL_MULTI_RANK_GPU_ENABLE": "true"}, steps=1)
    if "NCCL 2.30.0 has NCCL_MULTI_RANK_GPU_ENABLE = true (1 enables it)" not in r.stdout:
        fail(f"staged_true: the fallback's line does not give the value:\n{r.stdout[-2000:]}")
    print("ok   NCCL_MULTI_RANK_GPU_ENABLE=true: host-staged MPI, the line gives the value")
    print(f"PASS: {len(LAYOUTS) + 4} runs of the comm layer on the fake NCCL's build match the CPU")


if __name__ == "__main__":
    main()
