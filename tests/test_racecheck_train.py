"""The CUDA host code and kernels under ThreadSanitizer (the racecheck build,
GPTC_SANITIZE=thread): gptc-train-emu (the real host code of engine/cuda on the fake CUDA
runtime of tests/cuda_emu) trains in layouts that use every overlap policy, in fp32 and
(the pipeline run) bf16, and TSan must report nothing. That covers the kernels' races
within a block and between blocks (emu_runtime.c's racecheck) and every access of a copy,
a cuBLASLt product, a kernel or a host worker that the streams, events and host flags
leave unordered: a communication lane that does not wait for the
compute stream (comm_lane_after_compute without its stream_wait_event) is reported, a
cuBLASLt product reading what the lane's copy writes. Not covered: two kernels of
different streams (the emulator runs one grid at a time under a lock, which orders them);
gptc launches every kernel on the model's compute stream, and its lanes run only copies,
collectives and host-flag kernels, which are checked.
The last run takes the NCCL path (gptc-train-emu-nccl, the fake NCCL of tests/cuda_emu).
Open MPI's own synchronization is not instrumented: tests/tsan.supp.

    test_racecheck_train.py GPTC_TRAIN_EMU GPTC_TRAIN_EMU_NCCL"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import fail, run_train, work_dir, write_tokens  # noqa: E402

SUPP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tsan.supp")

RUNS = [
    # (name, ranks, NCCL, arguments)
    ("tp2 x dp2: chunked, sequence parallel, bucket, ZeRO-1, kernel timing", 4, False,
     ["--parallel.tp=2", "--parallel.dp=2", "--overlap.tp=chunked",
      "--parallel.sequence_parallel=true", "--overlap.dp=bucket", "--overlap.dp_bucket_mb=0.01",
      "--overlap.dp_shard=optimizer", "--profile.timing=kernel"]),
    ("pp2 interleaved, async, bf16", 2, False,
     ["--model.n_layer=4", "--parallel.pp=2", "--parallel.schedule=interleaved",
      "--parallel.virtual_stages=2", "--overlap.pp=async", "--train.precision=bf16"]),
    ("dp2 over NCCL: bucket, ZeRO-1", 2, True,
     ["--parallel.dp=2", "--overlap.dp=bucket", "--overlap.dp_bucket_mb=0.01",
      "--overlap.dp_shard=optimizer"]),
]


def main():
    if len(sys.argv) != 3:
        fail("usage: test_racecheck_train.py GPTC_TRAIN_EMU GPTC_TRAIN_EMU_NCCL")
    d = work_dir("gptc_racecheck_")
    write_tokens(f"{d}/tok.h5", np.random.default_rng(5).integers(0, 256, 4000), 256)
    # small: TSan and the emulator together are ~1000 times slower than the CPU backend
    base = ["--model.n_layer=2", "--model.n_head=2", "--model.d_model=64", "--model.n_ctx=16",
            "--model.vocab_size=256", f"--data.path={d}/tok.h5", "--train.device=cuda",
            "--train.steps=2", "--train.global_batch=4", "--train.micro_batch=2",
            "--train.seq_len=16"]
    # the shared-memory transport: Open MPI's TCP one takes its locks in both orders
    env = {"TSAN_OPTIONS": f"halt_on_error=1 suppressions={SUPP}", "OMPI_MCA_btl": "self,vader"}
    for name, ranks, nccl, extra in RUNS:
        # the fake NCCL is 2.30: several ranks on its one GPU once allowed
        e = dict(env, NCCL_MULTI_RANK_GPU_ENABLE="1") if nccl else env
        r = run_train(base + extra, np_ranks=ranks, train=sys.argv[2 if nccl else 1], extra_env=e,
                      timeout=600)
        steps = [x for x in r.stdout.splitlines() if x.startswith("step ")]
        backend = "communication: nccl" in r.stdout
        if r.returncode or "ThreadSanitizer" in r.stderr or len(steps) != 2 or backend != nccl:
            fail(f"{name}: exit {r.returncode}, {len(steps)} step(s):\n{r.stdout[-2000:]}"
                 f"{r.stderr[-6000:]}")
        print(f"ok   {name}: {ranks} ranks, 2 steps, no report")
    print(f"PASS: {len(RUNS)} training runs of the CUDA host code without a race")


if __name__ == "__main__":
    main()
