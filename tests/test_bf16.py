"""train.precision = bf16 on the CPU reference: matmul operands rounded to bf16 (nearest
even) with fp32 accumulation, and attention as tensor-core flash kernels compute it
(engine/cpu/cpu_ops.c, cpu_attention_forward_bf16; test_cpu_bf16 checks it op by op).

The tiny GPT-2 of test_layouts for 5 steps. What bf16 must show, and why these numbers:
  - Rounding really happens: step 1 (the same parameters in every run, so only the
    forward and backward differ) gives a grad norm that differs from the fp32 run's by
    more than STEP1_GRAD (measured 8.9e-5; a run that silently stayed fp32 differs by
    ~1e-7) yet a loss within 1e-4 (bf16 keeps 8 bits: the loss of a 4-layer model moves
    by ~1e-6).
  - Layouts agree with one rank: at step 1 within STEP1_GRAD on the grad norm and 1e-6
    on the loss (a layout changes only fp32 summation order, ~1e-7; an element that
    lands near a bf16 rounding boundary can then round the other way, which moved the
    step-1 grad norm by at most 8.7e-6 over the layouts below); over all 5 steps within
    ALL_STEPS (AdamW takes steps of ~lr whatever the gradient's size, so those flips
    grow: measured at most 1.1e-3 on the grad norm, 1.4e-5 on the loss).
  - A save in bf16 resumes with exactly the uninterrupted run's losses."""
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import compare_metrics, fail, read_metrics, run_train, write_tokens  # noqa: E402

STEP1_GRAD = 2e-5
STEP1_LOSS = 1e-6
ALL_STEPS = 3e-3
D = tempfile.mkdtemp(prefix="gptc_bf16_")


def train(name, ranks, extra):
    log = f"{D}/{name}.jsonl"
    args = ["--model.n_layer=4", "--model.n_head=4", "--model.d_model=64", "--model.n_ctx=32",
            "--model.vocab_size=251", f"--data.path={D}/tok.h5", "--train.steps=5",
            "--train.global_batch=8", "--train.micro_batch=2", "--train.seq_len=32",
            "--train.lr=3e-3", "--train.warmup_steps=1", "--train.lr_schedule=cosine",
            "--train.grad_clip=0.5", f"--train.log_file={log}"] + extra
    r = run_train(args, np_ranks=ranks if ranks > 1 else None, timeout=300)
    if r.returncode:
        fail(f"{name}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return read_metrics(log), r.stdout


def rel(a, b, key):
    return abs(a[key] - b[key]) / abs(a[key])


def compare_bf16(name, ref, got):
    """got against the one-rank bf16 run ref: step 1 tightly, every step loosely."""
    worst = compare_metrics(name, ref, got, ALL_STEPS, "one rank's")
    if not rel(ref[0], got[0], "loss") <= STEP1_LOSS or not rel(ref[0], got[0], "grad_norm") <= STEP1_GRAD:
        fail(f"{name}: step 1 loss {got[0]['loss']!r} / grad norm {got[0]['grad_norm']!r} vs one rank's "
             f"{ref[0]['loss']!r} / {ref[0]['grad_norm']!r}: beyond {STEP1_LOSS} / {STEP1_GRAD}")
    print(f"ok   {name:<34} step 1 grad norm {rel(ref[0], got[0], 'grad_norm'):.1e}, "
          f"worst over 5 steps {worst:.1e}")


LAYOUTS = [
    ("bf16 dp2", 2, ["--parallel.dp=2"]),
    ("bf16 tp2 SP chunked", 2, ["--parallel.tp=2", "--parallel.sequence_parallel=true",
                                "--overlap.tp=chunked"]),
    ("bf16 pp2 interleaved async", 2, ["--parallel.pp=2", "--parallel.schedule=interleaved",
                                       "--parallel.virtual_stages=2", "--overlap.pp=async"]),
    ("bf16 tp2 x pp2 x dp2 ZeRO-1 bucket", 8, ["--parallel.tp=2", "--parallel.pp=2",
                                               "--parallel.dp=2", "--overlap.dp=bucket",
                                               "--overlap.dp_shard=optimizer",
                                               "--overlap.dp_bucket_mb=0.01"]),
]


def main():
    write_tokens(f"{D}/tok.h5", np.random.default_rng(7).integers(0, 251, 4000), 251)
    fp32, _ = train("fp32", 1, [])
    bf16, out = train("bf16", 1, ["--train.precision=bf16", f"--train.save={D}/bf16.h5",
                                  "--train.save_every=3", "--train.keep=2"])
    if "precision: bf16" not in out:
        fail(f"the start-up lines do not name the precision:\n{out[-1500:]}")
    d_loss, d_grad = rel(fp32[0], bf16[0], "loss"), rel(fp32[0], bf16[0], "grad_norm")
    if not d_grad > STEP1_GRAD:
        fail(f"step 1 grad norm of bf16 {bf16[0]['grad_norm']!r} vs fp32 {fp32[0]['grad_norm']!r}: "
             f"rel {d_grad:.1e}, not above {STEP1_GRAD}: are the operands rounded?")
    if not d_loss <= 1e-4:
        fail(f"step 1 loss of bf16 {bf16[0]['loss']!r} vs fp32 {fp32[0]['loss']!r}: rel {d_loss:.1e} > 1e-4")
    print(f"ok   bf16 vs fp32 at step 1: loss {d_loss:.1e}, grad norm {d_grad:.1e} (rounding happens)")

    for name, ranks, extra in LAYOUTS:
        got, _ = train(name.replace(" ", "_"), ranks, ["--train.precision=bf16"] + extra)
        compare_bf16(name, bf16, got)

    resumed, _ = train("bf16_resumed", 1, ["--train.precision=bf16", f"--train.init={D}/bf16.step3.h5"])
    want = [m for m in bf16 if m["step"] > 3]
    if [(m["step"], m["loss"], m["grad_norm"]) for m in resumed] != \
            [(m["step"], m["loss"], m["grad_norm"]) for m in want]:
        fail(f"bf16 resume from step 3: {resumed} != {want}")
    print("ok   bf16 resume from step 3: steps 4-5 identical to the uninterrupted run")
    print("PASS: bf16 rounds, agrees across layouts and resumes exactly")


if __name__ == "__main__":
    main()
