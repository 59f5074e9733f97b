"""CPU scaling table: one model, one global batch, every layout at 1, 2, 4 and 8 ranks.

Reports ms/step (median after the first 2 steps), steps/s, the per-rank parameter and
optimizer-state memory gptc allocates (rank 0's figures, from its start-up line), and the
peak RSS of the largest rank. Run with Debian's python3 from the repository root:
    /usr/bin/python3 benchmarks/cpu_scaling.py [--steps 6] [--out benchmarks/cpu_scaling.md]
All ranks share this machine's cores (2 here), so more ranks do not mean more compute:
the table shows what each layout costs and how memory per rank shrinks, not speed-up.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(os.environ.get("GPTC_BUILD", os.path.join(ROOT, "build")), "gptc-train")
MODEL = dict(n_layer=8, n_head=8, d_model=256, n_ctx=128, vocab_size=4096)
BATCH = dict(global_batch=16, micro_batch=2, seq_len=128)

LAYOUTS = [  # name, ranks, extra keys
    ("single", 1, {}),
    ("dp2", 2, {"parallel.dp": 2}),
    ("dp2 ZeRO-1", 2, {"parallel.dp": 2, "overlap.dp_shard": "optimizer"}),
    ("tp2", 2, {"parallel.tp": 2}),
    ("tp2 SP", 2, {"parallel.tp": 2, "parallel.sequence_parallel": "true"}),
    ("pp2 1f1b", 2, {"parallel.pp": 2}),
    ("dp4 ZeRO-1", 4, {"parallel.dp": 4, "overlap.dp_shard": "optimizer"}),
    ("tp4", 4, {"parallel.tp": 4}),
    ("pp4 1f1b", 4, {"parallel.pp": 4}),
    ("pp2 interleaved v2", 2, {"parallel.pp": 2, "parallel.schedule": "interleaved",
                               "parallel.virtual_stages": 2}),
    ("tp2 x pp2", 4, {"parallel.tp": 2, "parallel.pp": 2}),
    ("tp2 x dp2", 4, {"parallel.tp": 2, "parallel.dp": 2}),
    ("dp8 ZeRO-1", 8, {"parallel.dp": 8, "overlap.dp_shard": "optimizer"}),
    ("tp8", 8, {"parallel.tp": 8}),
    ("pp8 1f1b", 8, {"parallel.pp": 8}),
    ("tp2 x pp2 x dp2", 8, {"parallel.tp": 2, "parallel.pp": 2, "parallel.dp": 2}),
]


def run(name, ranks, extra, tokens, steps, work):
    log = os.path.join(work, re.sub(r"\W+", "_", name) + ".jsonl")
    keys = {**{f"model.{k}": v for k, v in MODEL.items()},
            **{f"train.{k}": v for k, v in BATCH.items()},
            "train.steps": steps, "data.path": tokens, "train.log_file": log, **extra}
    args = [f"--{k}={v}" for k, v in keys.items()]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS=str(max(1, os.cpu_count() // ranks)))
    cmd = (["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)] if ranks > 1 else [])
    cmd += ["/usr/bin/time", "-f", "peak_rss_kb %M", TRAIN, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode:
        sys.exit(f"{name} failed:\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    rows = [json.loads(x) for x in open(log) if x.strip()]
    ms = statistics.median(x["iter_ms"] for x in rows if x["step"] > 2)
    mem = re.search(r"parameters ([\d.]+) MiB(?: \(\+ [\d.]+ MiB bf16 copy\))?, gradients ([\d.]+) MiB, "
                    r"optimizer state ([\d.]+) MiB, activations ([\d.]+) MiB", r.stdout)
    rss = max(int(x) for x in re.findall(r"peak_rss_kb (\d+)", r.stderr)) / 1024
    return ms, [float(x) for x in mem.groups()], rss, rows[-1]["loss"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None, metavar="REGEX",
                    help="run only the layouts whose name matches (e.g. '^pp2')")
    a = ap.parse_args()
    if a.steps < 3:
        ap.error("need --steps >= 3 (the first 2 are not timed)")
    work = tempfile.mkdtemp(prefix="gptc_scaling_")
    tokens = os.path.join(work, "tokens.h5")
    with h5py.File(tokens, "w") as f:
        f["tokens"] = np.random.default_rng(0).integers(0, MODEL["vocab_size"], 400_000).astype(np.uint16)
        f.attrs["vocab_size"] = np.int64(MODEL["vocab_size"])
    lines = [f"Model {MODEL}, batch {BATCH}, {a.steps} steps, {os.cpu_count()} cores shared by all ranks.",
             "",
             "| layout | ranks | ms/step | steps/s | params MiB/rank | optimizer MiB/rank | activations MiB/rank | peak RSS MiB (max rank) | final loss |",
             "|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    layouts = [x for x in LAYOUTS if not a.only or re.search(a.only, x[0])]
    if not layouts:
        ap.error(f"--only {a.only}: no layout matches")
    for name, ranks, extra in layouts:
        ms, (p, g, o, act), rss, loss = run(name, ranks, extra, tokens, a.steps, work)
        line = (f"| {name} | {ranks} | {ms:.0f} | {1000 / ms:.2f} | {p:.1f} | {o:.1f} | {act:.1f} | "
                f"{rss:.0f} | {loss:.4f} |")
        lines.append(line)
        print(line, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
