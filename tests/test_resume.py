"""Exact resume: 6 steps in one run equal 3 steps + checkpoint + 3 resumed steps, bit for
bit on the CPU (same losses, grad norms and learning rates), and the final checkpoints of
both paths hold identical parameters and optimizer state. The split runs use warm-up then
a constant rate, whose values do not depend on train.steps; a cosine run checks that a
resumed run continues the schedule of the step it resumes at."""
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import (fail, read_metrics, run_train, tensors_differ, work_dir,  # noqa: E402
                          write_tokens)

MODEL = ["--model.n_layer=2", "--model.n_head=2", "--model.d_model=32", "--model.n_ctx=16",
         "--model.vocab_size=50"]


def main():
    d = work_dir("gptc_resume_")
    rng = np.random.default_rng(3)
    write_tokens(f"{d}/tok.h5", rng.integers(0, 50, 3000), 50)
    common = MODEL + [f"--data.path={d}/tok.h5", "--train.global_batch=4", "--train.micro_batch=2",
                      "--train.seq_len=16", "--train.lr=1e-2", "--train.lr_schedule=constant",
                      "--train.warmup_steps=2", "--train.steps=6", "--data.shuffle=true"]
    r = run_train(common + [f"--train.log_file={d}/full.jsonl", f"--train.save={d}/full.h5"])
    if r.returncode:
        fail("full run failed: " + r.stderr)
    r = run_train(common + ["--train.steps=3", f"--train.log_file={d}/a.jsonl",
                            f"--train.save={d}/half.h5"])
    if r.returncode:
        fail("first half failed: " + r.stderr)
    # resume: the model shape comes from the checkpoint; [model] keys that agree are fine
    r = run_train(common + [f"--train.init={d}/half.h5", f"--train.log_file={d}/b.jsonl",
                            f"--train.save={d}/resumed.h5"])
    if r.returncode:
        fail("resumed run failed: " + r.stderr)
    full = read_metrics(f"{d}/full.jsonl")
    split = read_metrics(f"{d}/a.jsonl") + read_metrics(f"{d}/b.jsonl")
    if [m["step"] for m in split] != list(range(1, 7)) or len(full) != 6:
        fail(f"unexpected steps: full {[m['step'] for m in full]}, split {[m['step'] for m in split]}")
    for a, b in zip(full, split):
        for k in ("loss", "grad_norm", "lr"):
            if a[k] != b[k]:
                fail(f"step {a['step']}: {k} {a[k]!r} (one run) != {b[k]!r} (resumed)")
        print(f"step {a['step']}: loss {a['loss']:.9g} grad_norm {a['grad_norm']:.9g} identical")
    with h5py.File(f"{d}/full.h5") as f, h5py.File(f"{d}/resumed.h5") as g:
        if f.attrs["step"] != 6 or g.attrs["step"] != 6:
            fail("final checkpoints should be of step 6")
        if f["optim"].attrs["t"] != g["optim"].attrs["t"]:
            fail("optimizer step count differs")
    differ, _ = tensors_differ(f"{d}/full.h5", f"{d}/resumed.h5")
    if differ:
        fail(f"/{differ[0]} differs between the one-run and resumed checkpoints")
    # cosine over 6 steps, checkpoint every 3 with keep = 2: the kept step-3 checkpoint
    # resumes into exactly the uninterrupted run's steps 4..6 (schedule, data and all)
    cos = [x for x in common if "lr_schedule" not in x] + ["--train.lr_schedule=cosine"]
    r = run_train(cos + [f"--train.log_file={d}/cos.jsonl", f"--train.save={d}/cos.h5",
                         "--train.save_every=3", "--train.keep=2"])
    if r.returncode:
        fail("cosine run failed: " + r.stderr)
    kept = sorted(x for x in os.listdir(d) if x.startswith("cos.step"))
    if kept != ["cos.step3.h5", "cos.step6.h5"]:
        fail(f"train.keep=2 should leave cos.step3.h5 and cos.step6.h5, found {kept}")
    r = run_train(cos + [f"--train.init={d}/cos.step3.h5", f"--train.log_file={d}/cos_b.jsonl"])
    if r.returncode:
        fail("cosine resume failed: " + r.stderr)
    full = read_metrics(f"{d}/cos.jsonl")[3:]
    resumed = read_metrics(f"{d}/cos_b.jsonl")
    for a, b in zip(full, resumed):
        for k in ("step", "loss", "grad_norm", "lr"):
            if a[k] != b[k]:
                fail(f"cosine step {a['step']}: {k} {a[k]!r} (one run) != {b[k]!r} (resumed)")
    if len(resumed) != 3 or full[0]["lr"] == full[-1]["lr"]:
        fail("cosine resume: expected 3 resumed steps with a decaying rate")
    print(f"cosine: steps 4..6 resumed from the kept step-3 checkpoint are identical")
    # after a crash between checkpoints the log already holds the steps the resumed run
    # repeats: they are replaced, not appended twice
    import shutil
    shutil.copy(f"{d}/cos.jsonl", f"{d}/crash.jsonl")
    r = run_train(cos + [f"--train.init={d}/cos.step3.h5", f"--train.log_file={d}/crash.jsonl"])
    if r.returncode:
        fail("resume onto a log that runs ahead failed: " + r.stderr)
    crash = read_metrics(f"{d}/crash.jsonl")
    same = [{k: x[k] for k in ("step", "loss", "grad_norm", "lr")} for x in crash] == \
        [{k: x[k] for k in ("step", "loss", "grad_norm", "lr")} for x in read_metrics(f"{d}/cos.jsonl")]
    if [x["step"] for x in crash] != list(range(1, 7)) or not same:
        fail(f"a resumed run's log should hold steps 1..6 once, as the one run: "
             f"{[x['step'] for x in crash]}")
    print("log: a resumed run replaces the lines of the steps it repeats")
    # train.keep counts the versions an earlier run kept: resuming at step 7 and saving at
    # step 9 leaves the newest two, steps 6 and 9
    r = run_train(cos + [f"--train.init={d}/cos.h5", "--train.steps=9", f"--train.save={d}/cos.h5",
                         "--train.save_every=3", "--train.keep=2"])
    if r.returncode:
        fail("resume with train.keep failed: " + r.stderr)
    kept = sorted(x for x in os.listdir(d) if x.startswith("cos.step"))
    if kept != ["cos.step6.h5", "cos.step9.h5"]:
        fail(f"train.keep=2 across a resume should leave cos.step6.h5 and cos.step9.h5, "
             f"found {kept}")
    print("keep: the versions of the run before count, the oldest is removed")
    # the oldest is removed by the first save past keep, not at the start: a resumed run
    # that saves nothing (no step left) or fails before its first save removed them for
    # nothing
    r = run_train(cos + [f"--train.init={d}/cos.h5", "--train.steps=12", f"--train.save={d}/cos.h5",
                         "--train.save_every=3", "--train.keep=3"])
    if r.returncode:
        fail("resume to step 12 with train.keep=3 failed: " + r.stderr)
    # the second diverges (as test_nan's) before its first save, at step 40
    for run in (["--train.steps=12"], ["--train.steps=40", "--train.save_every=40", "--train.lr=1000",
                                       "--train.lr_schedule=constant", "--train.grad_clip=0"]):
        r = run_train(cos + [f"--train.init={d}/cos.h5", f"--train.save={d}/cos.h5",
                             "--train.save_every=3", "--train.keep=2"] + run)
        kept = sorted(x for x in os.listdir(d) if x.startswith("cos.step"))
        ended = "no step to run" in r.stdout if len(run) == 1 else \
            r.returncode != 0 and "is not finite (train.nan_policy = stop)" in r.stderr
        if kept != ["cos.step12.h5", "cos.step6.h5", "cos.step9.h5"] or not ended:
            fail(f"train.keep=2 in a run that saved nothing ({' '.join(run)}: exit "
                 f"{r.returncode}) should leave the 3 versions, found {kept}:\n"
                 f"{r.stdout[-400:]}{r.stderr[-400:]}")
    # a file of a version this run would write, not a checkpoint: refused at the start
    with open(f"{d}/cos.step15.h5", "w") as f:
        f.write("my notes\n")
    r = run_train(cos + [f"--train.init={d}/cos.h5", "--train.steps=15", f"--train.save={d}/cos.h5",
                         "--train.save_every=3", "--train.keep=2"])
    if r.returncode != 1 or "train.keep" not in r.stderr or "cos.step15.h5: exists and is not " \
            "an HDF5 file" not in r.stderr or open(f"{d}/cos.step15.h5").read() != "my notes\n":
        fail(f"train.keep over a text file named like a version: exit {r.returncode}, "
             f"{r.stderr[-400:]!r}")
    # a FIFO there: refused, not opened (an open waits for a writer: the job hung)
    os.remove(f"{d}/cos.step15.h5")
    os.mkfifo(f"{d}/cos.step15.h5")
    r = run_train(cos + [f"--train.init={d}/cos.h5", "--train.steps=15", f"--train.save={d}/cos.h5",
                         "--train.save_every=3", "--train.keep=2"], timeout=60)
    if r.returncode != 1 or "cos.step15.h5: exists and is not a regular file" not in r.stderr:
        fail(f"train.keep over a FIFO named like a version: exit {r.returncode}, "
             f"{r.stderr[-400:]!r}")
    os.remove(f"{d}/cos.step15.h5")
    print("ok   keep: a run that saves nothing removes no version; a version's name held by "
          "another file is refused")
    # a rewind: resumed from step 6 with versions of steps 9 and 12 there, saving at 8 and
    # 10, keep = 3: 6, 8 and 10 are this run's newest three; 9 and 12, all that is left of
    # the run that went further, stay (uncounted), and a warning names them
    r = run_train(cos + [f"--train.init={d}/cos.step6.h5", "--train.steps=10",
                         f"--train.save={d}/cos.h5", "--train.save_every=4", "--train.keep=3"])
    kept = sorted(int(x[8:-3]) for x in os.listdir(d) if x.startswith("cos.step"))
    warned = [x for x in r.stderr.splitlines() if x.startswith("gptc: warning: train.keep: 2 "
              "version(s) of steps from this run's first (7) on, ") and
              f"{d}/cos.step9.h5 to {d}/cos.step12.h5" in x]
    if r.returncode or kept != [6, 8, 9, 10, 12] or len(warned) != 1:
        fail(f"train.keep=3 resumed from before the newest version: exit {r.returncode}, "
             f"versions {kept} (want 6, 8, 9, 10, 12), warning {warned}:\n{r.stderr[-800:]}")
    print(f"ok   keep: a rewound run leaves the later versions, saying so: {warned[0][14:90]}...")
    # a resumed run with no step left (train.steps read as "more steps", not "up to"):
    # train.save, here a later run's checkpoint, stays as it was
    before = open(f"{d}/full.h5", "rb").read()
    r = run_train(common + [f"--train.init={d}/half.h5", "--train.steps=3",
                            f"--train.save={d}/full.h5"])
    if r.returncode or "no step to run" not in r.stdout or open(f"{d}/full.h5", "rb").read() != before:
        fail(f"a resumed run with no step left: exit {r.returncode}, or it replaced train.save\n"
             f"{r.stdout[-600:]}{r.stderr[-600:]}")
    print("ok   a resumed run with no step left leaves train.save as it was")
    # datasets the model has no use for (Hugging Face's GPT-2 keeps its causal-mask buffers
    # as h.N.attn.bias) are left out, and the run says so
    import shutil
    shutil.copy(f"{d}/half.h5", f"{d}/extra.h5")
    with h5py.File(f"{d}/extra.h5", "r+") as f:
        f["model"].create_dataset("h.0.attn.bias", data=np.ones((1, 1, 16, 16), np.float32))
        f["model"].create_dataset("h.0.attn.masked_bias", data=np.float32(-1e4))
    r = run_train(common + [f"--train.init={d}/extra.h5", "--train.steps=4"])
    said = [x for x in r.stdout.splitlines() if "does not have" in x]
    if r.returncode or len(said) != 1 or "2 dataset(s)" not in said[0] or "/model/h.0.attn" not in said[0]:
        fail(f"extra datasets in train.init: exit {r.returncode}, lines {said}\n{r.stderr[-600:]}")
    print(f"ok   {said[0]}")
    check_effective_config(d)
    print("PASS: resume is exact")


def check_effective_config(d):
    """The printed configuration shows what the run derived, not the unset defaults: the
    model shape from the checkpoint, dp from the world size, seq_len and micro_batch."""
    r = run_train([f"--data.path={d}/tok.h5", f"--train.init={d}/half.h5", "--train.steps=3",
                   "--train.global_batch=4"])
    if r.returncode:
        fail("run from a checkpoint with no [model] keys failed: " + r.stderr)
    if "# effective configuration" not in r.stdout:
        fail("no effective configuration printed:\n" + r.stdout)
    printed, section = {}, None
    for line in r.stdout.split("# effective configuration", 1)[1].splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif " = " in line and section:
            key, value = line.split(" = ", 1)
            printed[f"{section}.{key}"] = value
    want = {"model.n_layer": "2", "model.n_head": "2", "model.d_model": "32",
            "model.n_ctx": "16", "model.vocab_size": "50", "parallel.dp": "1",
            "train.seq_len": "16", "train.micro_batch": "4"}
    for key, value in want.items():
        if printed.get(key) != value:
            fail(f"effective configuration: {key} = {printed.get(key)!r}, expected {value}")
    print("effective configuration: model shape, dp, seq_len and micro_batch as derived")


if __name__ == "__main__":
    main()
