"""Numerical trouble: a learning rate far too large drives the loss to NaN/Inf.
train.nan_policy = stop ends the run with one line naming the step (and, with kernel
timing, the first op that wrote a non-finite value, found by replaying the step) and a
nonzero exit on every rank; skip leaves out the bad updates and carries on."""
import json
import math
import os
import re
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import fail, run_train, tensors_differ, work_dir, write_tokens  # noqa: E402

D = work_dir("gptc_nan_")
BASE = ["--model.n_layer=2", "--model.n_head=2", "--model.d_model=64", "--model.n_ctx=32",
        "--model.vocab_size=256", f"--data.path={D}/tok.h5", "--train.steps=30",
        "--train.global_batch=4", "--train.lr=1000", "--train.grad_clip=0"]


def error_line(r, name):
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gptc: error:")]
    if r.returncode == 0 or len(lines) != 1:
        fail(f"{name}: expected a nonzero exit and one error line, got {r.returncode}:\n{r.stderr}")
    return lines[0]


def main():
    write_tokens(f"{D}/tok.h5", np.random.default_rng(4).integers(0, 256, 5000), 256)
    line = error_line(run_train(BASE + [f"--train.log_file={D}/stop.jsonl"]), "stop")
    m = re.search(r"step (\d+): loss .* is not finite \(train.nan_policy = stop\)", line)
    if not m or "-nan" in line:
        fail(f"stop: unexpected message: {line}")
    # the step that stopped the run has its metrics line, its update left out; every
    # number a JSON reader sees in a column has one type (a whole lr of 1000 as 1000.0)
    rows = [json.loads(x, parse_constant=lambda c: fail(f"metrics hold {c}"))
            for x in open(f"{D}/stop.jsonl")]
    last = rows[-1] if rows else {}
    if len(rows) != int(m.group(1)) or last.get("step") != int(m.group(1)) or \
            not last.get("skipped") or not all(isinstance(x["lr"], float) for x in rows):
        fail(f"stop: the metrics end with {last}, {len(rows)} lines; want the stopping step's")
    print(f"ok   stop: {line}; its metrics line: {last}")
    line = error_line(run_train(BASE + ["--profile.timing=kernel"]), "stop, timed")
    op = re.search(r"first non-finite output: (\w+ \(.*micro-batch \d+, (fwd|bwd)\)) on rank 0", line)
    if not op:
        fail(f"stop with kernel timing does not name the op: {line}")
    # the replay runs on the parameters the bad step started from, which are finite (its
    # update is left out): the embedding of finite tables is finite, so an op after it
    # comes first (a replay on the updated parameters named embedding_fwd)
    op = op.group(1)
    if op.startswith("embedding_fwd"):
        fail(f"stop with kernel timing names the embedding, whose inputs are finite: {line}")
    print(f"ok   stop with kernel timing: {line}")
    # the report and trace of the steps that ran, the one that stopped the run too: where
    # one looks when a run blows up (none were written)
    out = [f"--profile.report={D}/tp2.report.json", f"--profile.trace={D}/tp2.trace.json"]
    line = error_line(run_train(BASE + ["--profile.timing=kernel", "--parallel.tp=2"] + out,
                                np_ranks=2), "stop, tp2")
    if f"first non-finite output: {op}" not in line:
        fail(f"tp2: the op is not named, or not the one rank's ({op}): {line}")
    stopped = int(re.search(r"step (\d+):", line).group(1))
    try:
        report = json.load(open(f"{D}/tp2.report.json"))
        trace = json.load(open(f"{D}/tp2.trace.json"))["traceEvents"]
    except (OSError, ValueError) as e:
        fail(f"tp2: no whole report and trace after the stop: {e}")
    steps = sorted({(x["rank"], x["step"]) for x in report["steps"]})
    events = [x for x in trace if x.get("ph") == "X"]
    want = [(r, s) for r in (0, 1) for s in range(1, stopped + 1)]
    # the replay's forward and backward are not a step's: one attention_fwd per layer and
    # micro-batch a step (2 layers, 1 micro-batch)
    last = [x for x in events if x["name"].startswith("attention_fwd") and x["pid"] == 0
            and x.get("args", {}).get("step") == stopped]
    if steps != want or not report["kernels"] or len(last) != 2:
        fail(f"tp2: the report holds steps {steps}, want {want}; {len(report['kernels'])} kernel "
             f"rows; step {stopped} has {len(last)} attention_fwd on rank 0")
    print(f"ok   tp2: {line}; report and trace of steps 1..{stopped} written")
    # dp2 with bucketed overlap: the replay's bucket all-reduces ran on the lane's thread
    # while write_timing's collectives ran on the same communicator (they must end first)
    line = error_line(run_train(BASE + ["--profile.timing=kernel", "--parallel.dp=2",
                                        "--overlap.dp=bucket", "--overlap.dp_bucket_mb=0.01",
                                        f"--profile.report={D}/dp2.report.json"],
                                np_ranks=2, timeout=120), "stop, dp2 bucket")
    stopped = int(re.search(r"step (\d+):", line).group(1))
    if f"first non-finite output: {op}" not in line:
        fail(f"dp2 bucket: the op is not named, or not the one rank's ({op}): {line}")
    steps = sorted({(x["rank"], x["step"]) for x in json.load(open(f"{D}/dp2.report.json"))["steps"]})
    if steps != [(r, s) for r in (0, 1) for s in range(1, stopped + 1)]:
        fail(f"dp2 bucket: the report holds steps {steps}, want 1..{stopped} on ranks 0 and 1")
    print(f"ok   dp2 bucket: {line}; report of steps 1..{stopped} written")
    r = run_train(BASE + ["--train.nan_policy=skip", f"--train.log_file={D}/skip.jsonl",
                          f"--train.save={D}/skip.h5"])
    if r.returncode != 0 or "update skipped" not in r.stdout:
        fail(f"skip: exit {r.returncode}, or no skipped update reported\n{r.stderr[-1000:]}")
    # printf's sign of a NaN is noise to a reader (and to a grep for "nan")
    signed = [x for x in r.stdout.splitlines() if "-nan" in x]
    if signed:
        fail(f"skip: a NaN printed with a sign: {signed[0]}")
    print("ok   skip: bad updates left out, the run finished")
    # strict JSON, as jq and other languages' parsers read it: no NaN, no -nan
    rows = [json.loads(x, parse_constant=lambda c: fail(f"metrics hold {c}"))
            for x in open(f"{D}/skip.jsonl")]
    bad = [x for x in rows if x.get("skipped")]
    if len(rows) != 30 or not bad or any(x["loss"] is not None and math.isfinite(x["loss"])
                                         and x["grad_norm"] is not None for x in bad):
        fail(f"skip: {len(rows)} metrics lines, skipped ones {bad[:2]}")
    print(f"ok   skip: {len(bad)} skipped steps logged as strict JSON, e.g. {bad[0]}")
    # left out means left out: the final parameters and optimizer state are those of a run
    # that stopped after the last step that updated (the same steps, skips and all), and
    # AdamW's step count t counts the updates made. A skip that still applied its update
    # passed all of the above.
    good = [x["step"] for x in rows if not x.get("skipped")]
    r = run_train([a for a in BASE if not a.startswith("--train.steps=")] +
                  [f"--train.steps={good[-1]}", "--train.nan_policy=skip",
                   f"--train.save={D}/last_good.h5"])
    if r.returncode != 0:
        fail(f"skip: the run to step {good[-1]} failed: {r.stderr[-600:]}")
    with h5py.File(f"{D}/skip.h5") as fs:
        if int(fs["optim"].attrs["t"]) != len(good) or int(fs.attrs["step"]) != 30:
            fail(f"skip: the checkpoint of step {int(fs.attrs['step'])} has optimizer t "
                 f"{int(fs['optim'].attrs['t'])}, want 30 and the {len(good)} updates made")
    moved, compared = tensors_differ(f"{D}/last_good.h5", f"{D}/skip.h5")
    if moved:
        fail(f"skip: {len(moved)} tensors moved after step {good[-1]}, the last update, "
             f"e.g. {moved[0]}")
    print(f"ok   skip: parameters and optimizer state as after step {good[-1]} ({compared} "
          f"tensors), optimizer t {len(good)}")
    check_resume_after_skips()
    print("PASS: non-finite losses are caught")


def check_resume_after_skips():
    """A checkpoint written after skipped updates has AdamW's t (updates made) below its
    step: a run resumed from it goes on from t, not from the step (which the checkpoints
    of every other test hold alike), and ends bit for bit as the run that did not stop.
    Steps 3 and 4 overflow (GPTC_TEST_INF_GRAD_STEPS) at a sane learning rate."""
    base = [a for a in BASE if not a.startswith(("--train.steps=", "--train.lr="))] + \
        ["--train.lr=1e-3", "--train.nan_policy=skip"]
    inf = {"GPTC_TEST_INF_GRAD_STEPS": "3,4"}
    whole = run_train(base + ["--train.steps=8", f"--train.save={D}/whole.h5"], extra_env=inf)
    first = run_train(base + ["--train.steps=5", f"--train.save={D}/first.h5"], extra_env=inf)
    rest = run_train(base + ["--train.steps=8", f"--train.init={D}/first.h5",
                             f"--train.save={D}/rest.h5"], extra_env=inf)
    for name, r in (("whole", whole), ("first", first), ("rest", rest)):
        if r.returncode != 0:
            fail(f"resume after skips: the {name} run failed: {r.stderr[-600:]}")
    said = [x for x in whole.stdout.splitlines() if "update skipped" in x]
    if len(said) != 2 or not said[0].startswith("step 3:") or not said[1].startswith("step 4:"):
        fail(f"resume after skips: want steps 3 and 4 skipped, the run said {said}")
    with h5py.File(f"{D}/first.h5") as f1, h5py.File(f"{D}/whole.h5") as fw, \
            h5py.File(f"{D}/rest.h5") as fr:
        ts = [int(f["optim"].attrs["t"]) for f in (f1, fw, fr)]
    if ts != [3, 6, 6]:
        fail(f"resume after skips: optimizer t {ts} at steps 5, 8 and 8 resumed, want "
             f"[3, 6, 6] (the updates made)")
    moved, compared = tensors_differ(f"{D}/whole.h5", f"{D}/rest.h5")
    if moved:
        fail(f"resume after skips: {len(moved)} of {compared} tensors differ from the run "
             f"that did not stop, e.g. {moved[0]}")
    print(f"ok   resume after skipped steps 3 and 4: t 3 at step 5, resumed to step 8 bit "
          f"for bit as the whole run ({compared} tensors, t 6)")


if __name__ == "__main__":
    main()
