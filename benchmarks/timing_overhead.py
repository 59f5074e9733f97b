"""Cost of profile.timing = kernel against off: the same run alternated several times,
median ms/step of each after the first 2 steps. Run from the repository root with
Debian's python3:  /usr/bin/python3 benchmarks/timing_overhead.py [--ranks 1] [--reps 3]"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(os.environ.get("GPTC_BUILD", os.path.join(ROOT, "build")), "gptc-train")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    if a.ranks < 1 or a.reps < 1 or a.steps < 3:
        ap.error("need --ranks >= 1, --reps >= 1 and --steps >= 3 (the first 2 are not timed)")
    if 8 % (2 * a.ranks):
        ap.error(f"--ranks {a.ranks}: the global batch of 8 rows, in micro-batches of 2, splits "
                 f"over 1, 2 or 4 data-parallel ranks only")
    if not os.access(TRAIN, os.X_OK):
        ap.error(f"no {TRAIN}: build first (README), or set GPTC_BUILD")
    work = tempfile.mkdtemp(prefix="gptc_overhead_")
    try:
        measure(a, work)
    except subprocess.CalledProcessError as e:
        sys.exit(f"timing_overhead: gptc-train exited {e.returncode} (its lines are above)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(a, work):
    tok = os.path.join(work, "tok.h5")
    with h5py.File(tok, "w") as f:
        f["tokens"] = np.random.default_rng(0).integers(0, 4096, 300_000).astype(np.uint16)
        f.attrs["vocab_size"] = np.int64(4096)
    base = ["--model.n_layer=4", "--model.n_head=4", "--model.d_model=256", "--model.n_ctx=128",
            "--model.vocab_size=4096", f"--train.steps={a.steps}", "--train.global_batch=8",
            "--train.micro_batch=2", "--train.seq_len=128", f"--data.path={tok}"]
    if a.ranks > 1:
        base.append(f"--parallel.dp={a.ranks}")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS=str(max(1, os.cpu_count() // a.ranks)))
    launch = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(a.ranks)] if a.ranks > 1 else []
    ms = {"off": [], "kernel": []}
    for rep in range(a.reps):
        for mode in ("off", "kernel"):
            log = os.path.join(work, f"{mode}{rep}.jsonl")
            extra = [f"--profile.timing={mode}", f"--train.log_file={log}"]
            if mode == "kernel":
                extra.append(f"--profile.report={work}/report.json")
            subprocess.run(launch + [TRAIN, *base, *extra], check=True, env=env,
                           stdout=subprocess.DEVNULL)
            rows = [json.loads(x) for x in open(log) if x.strip()]
            ms[mode] += [r["iter_ms"] for r in rows if r["step"] > 2]
    off, on = statistics.median(ms["off"]), statistics.median(ms["kernel"])
    with open(f"{work}/report.json") as f:
        records = sum(k["count"] for k in json.load(f)["kernels"]) / (a.steps * a.ranks)
    print(f"ranks {a.ranks}: timing off {off:.2f} ms/step, kernel {on:.2f} ms/step, "
          f"overhead {100 * (on - off) / off:+.2f}% ({records:.0f} records per step and rank)")


if __name__ == "__main__":
    main()
