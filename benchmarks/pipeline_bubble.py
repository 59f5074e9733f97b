#!/usr/bin/env python3
"""The pipeline's bubble as the timing report measures it: pp = 2 under each schedule
(gpipe, 1f1b, interleaved with 2 virtual stages), 8 micro-batches a step, and the part of
each step the stages spent waiting for each other (the report's comm_wait_ms: exposed
communication during which every op in flight waited for another rank and nothing moved),
beside the bubble the schedule's arithmetic gives for equal stages:
(p - 1) / (v m + p - 1) of the step for p stages, v virtual stages each, m micro-batches
(which gptc's start-up line must give for its lists: the script stops where it does not).

    /usr/bin/python3 benchmarks/pipeline_bubble.py [--steps N] [--out FILE.md]

GPTC_BUBBLE_EXTRA adds arguments to every run (e.g. "--overlap.pp=async").

Runs on the CPU backend, one OpenMP thread a rank; each rank needs a core of its own for
the waits to be the schedule's and not the scheduler's. Prints a Markdown table."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("GPTC_BUILD", os.path.join(ROOT, "build"))
MODEL = ["--model.n_layer=8", "--model.n_head=8", "--model.d_model=256", "--model.n_ctx=128",
         "--model.vocab_size=256", "--train.seq_len=128", "--train.global_batch=16",
         "--train.micro_batch=2", "--train.lr=1e-3"]
M = 8  # micro-batches a step: global_batch / micro_batch
EXTRA = os.environ.get("GPTC_BUBBLE_EXTRA", "").split()
SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2))


def run(d, tokens, schedule, v, steps):
    rep = os.path.join(d, f"{schedule}.report.json")
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "--oversubscribe", "-np", "2", os.path.join(BUILD, "gptc-train"),
           os.path.join(ROOT, "configs", "tiny.ini")] + MODEL + [
        f"--data.path={tokens}", f"--train.steps={steps}", "--train.save=", "--train.log_file=",
        "--parallel.pp=2", f"--parallel.schedule={schedule}",
        f"--parallel.virtual_stages={v}", "--profile.timing=kernel", "--profile.warmup=2",
        f"--profile.report={rep}"] + EXTRA
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode:
        sys.exit(f"pipeline_bubble: {schedule} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    # the bubble of the schedule's lists where the stages are equal, from the start-up line
    m = re.search(r"^pipeline: .* a bubble of ([\d.]+)% of the step", r.stdout, re.M)
    if not m:
        sys.exit(f"pipeline_bubble: {schedule}: no 'pipeline: ...' start-up line")
    with open(rep) as f:
        return json.load(f)["overlap"], float(m.group(1)) / 100


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--steps", type=int, default=8, help="steps a run, the first 2 warm-up")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    if args.steps < 3:
        ap.error("--steps: at least 3 (2 warm-up steps, then the measured ones)")
    with tempfile.TemporaryDirectory(prefix="gptc_bubble_") as d:
        tokens = os.path.join(d, "tokens.h5")
        licenses = [os.path.join("/usr/share/common-licenses", f)
                    for f in sorted(os.listdir("/usr/share/common-licenses"))]
        subprocess.run([os.path.join(BUILD, "gptc-data"), "--out", tokens] + licenses,
                       check=True, capture_output=True)
        policy = next((a.split("=", 1)[1] for a in EXTRA if a.startswith("--overlap.pp=")),
                      "none")
        rows = ["| schedule | overlap.pp | iter ms | compute ms | exposed comm ms | waiting ms | "
                "waiting / iter | bubble (p-1)/(vm+p-1) |", "|---|---|---|---|---|---|---|---|"]
        for schedule, v in SCHEDULES:
            o, lists = run(d, tokens, schedule, v, args.steps)
            if o.get("comm_wait_ms") is None:
                sys.exit(f"pipeline_bubble: {schedule}: the report has no waits (matching "
                         f"skipped: see the run's warnings)")
            theory = 1 / (v * M + 1)
            if abs(lists - theory) > 0.0006:
                sys.exit(f"pipeline_bubble: {schedule}: the lists' bubble is {lists:.1%}, the "
                         f"arithmetic's {theory:.1%}")
            name = schedule if v == 1 else f"{schedule} v{v}"
            rows.append(f"| {name} | {policy} | {o['iter_ms']:.1f} | {o['compute_ms']:.1f} | "
                        f"{o['exposed_comm_ms']:.1f} | {o['comm_wait_ms']:.1f} | "
                        f"{o['comm_wait_ms'] / o['iter_ms']:.1%} | {theory:.1%} |")
    text = "\n".join(rows) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
