"""NVTX ranges as an NVTX tool (Nsight Systems) sees them: gptc-train runs with
NVTX_INJECTION64_PATH naming tests/fake_nvtx.c, which writes every range pushed and popped.

- With profile.nvtx = true (the default) and no kernel timing, each step is a range
  "step N" and every op inside it a range of the op's name, each collective too: the names
  the report and trace use. (The ops had been ranges only under profile.timing = kernel,
  whose wrapper pushed them: an nsys capture of an untimed run showed steps alone.)
- The same names with profile.timing = kernel.
- On two ranks (dp2, bucket), the all-reduces are ranges on each rank, the host-side
  agreements' (host_allreduce) too.
- Every range is closed on the thread that opened it, innermost first.
- profile.nvtx = false: no range at all (the tool is never even loaded).

Needs the CUDA build's gptc-train (engine/nvtx.c); the CPU backend runs the steps."""
import collections
import glob
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import fail, train_tiny, work_dir, write_tokens  # noqa: E402

STEPS = 2
VOCAB = 251
D = work_dir("gptc_nvtx_")
# one call of each a step: the embedding's, the head's and the optimizer's; one a layer
# and micro-batch (4 layers, 4 micro-batches of the tiny run's 8 rows on one rank)
ONCE = ("embedding_fwd", "lm_head_fwd", "loss", "adamw")
PER_LAYER = ("qkv_fwd", "attention_fwd", "attention_bwd", "fc_gelu_fwd")


def ranges(tag):
    """{pid: [(tid, name)]} of the ranges each process pushed, checking that each was
    popped on its thread, innermost first, and that none stayed open"""
    out = {}
    for path in glob.glob(f"{D}/nvtx_{tag}.*"):
        stacks = collections.defaultdict(list)
        pushed = []
        for ln in open(path):
            parts = ln.rstrip("\n").split(" ", 2)
            if parts[0] == "push":
                stacks[parts[1]].append(parts[2])
                pushed.append((parts[1], parts[2]))
            elif parts[0] == "pop":
                if not stacks[parts[1]]:
                    fail(f"{tag}: a pop on thread {parts[1]} with no range open ({path})")
                stacks[parts[1]].pop()
            else:
                fail(f"{tag}: line {ln!r} of {path}")
        left = {t: s for t, s in stacks.items() if s}
        if left:
            fail(f"{tag}: ranges left open at exit: {left} ({path})")
        out[path.rsplit(".", 1)[1]] = pushed
    return out


def run(tag, ranks, extra):
    env = {"NVTX_INJECTION64_PATH": LIB, "GPTC_FAKE_NVTX_OUT": f"{D}/nvtx_{tag}"}
    train_tiny(D, tag, ranks, "cpu", extra, STEPS, VOCAB, extra_env=env)
    return ranges(tag)


def check_ops(tag, got):
    """one process's ranges: the steps, each op's calls inside them"""
    (pushed,) = got.values()
    names = collections.Counter(name for _, name in pushed)
    for s in range(1, STEPS + 1):
        if names[f"step {s}"] != 1:
            fail(f"{tag}: range 'step {s}' pushed {names[f'step {s}']} times")
    for op in ONCE:
        if names[op] != STEPS * (4 if op != "adamw" else 1):
            fail(f"{tag}: range {op} pushed {names[op]} times: {dict(names)}")
    for op in PER_LAYER:
        if names[op] != STEPS * 4 * 4:
            fail(f"{tag}: range {op} pushed {names[op]} times, {STEPS * 16} expected: "
                 f"{dict(names)}")
    return names


def main():
    global LIB
    if len(sys.argv) != 2:
        fail("usage: test_nvtx.py LIBFAKE_NVTX")
    LIB = sys.argv[1]
    write_tokens(f"{D}/tok.h5", np.random.default_rng(5).integers(0, VOCAB, 4000), VOCAB)

    plain = check_ops("untimed", run("untimed", 1, []))
    timed = check_ops("timed", run("timed", 1, ["--profile.timing=kernel"]))
    if set(plain) != set(timed):
        fail(f"the ranges' names differ with kernel timing: {set(plain) ^ set(timed)}")
    print(f"ok   one rank: {len(plain)} range names, each step and every op's calls, with "
          f"kernel timing and without")

    dp2 = run("dp2", 2, ["--parallel.dp=2", "--overlap.dp=bucket", "--overlap.dp_bucket_mb=0.01"])
    if len(dp2) != 2:
        fail(f"dp2: ranges from {len(dp2)} processes, 2 expected")
    for pid, pushed in dp2.items():
        names = collections.Counter(name for _, name in pushed)
        if names["allreduce"] < STEPS or names["host_allreduce"] < STEPS:
            fail(f"dp2: process {pid} pushed {names['allreduce']} 'allreduce' and "
                 f"{names['host_allreduce']} 'host_allreduce' ranges in {STEPS} steps")
    print("ok   dp2 bucket: the all-reduces (the gradients' and the host's) are ranges on both ranks")

    if run("off", 1, ["--profile.nvtx=false"]):
        fail("profile.nvtx = false: the tool was loaded and saw ranges")
    print("ok   profile.nvtx = false: no range")
    print("PASS: NVTX ranges name the steps, ops and collectives")


if __name__ == "__main__":
    main()
