#!/usr/bin/env python3
"""Contention on one GPU: two data-parallel ranks share the GPU, overlap.dp = none vs
bucket, per-kernel timing on, every 4th step a contention probe (serialized) as the
baseline. For each run: step time, communication and its exposed part, and each big
kernel's mean time alone vs beside communication (the report's slowdown), and the same
for the device kernels behind the ops (the report's device_kernels, with CUPTI), in
$GPTC_BENCH_OUT/contention.md (+ the two report.json files and traces).

The ranks talk over NCCL when it allows two ranks on one GPU (>= 2.30 with
NCCL_MULTI_RANK_GPU_ENABLE=1, set here), else over MPI with host staging: the start-up
line, copied into the table, says which. Model: GPT-2 124M's layer shape, 6 layers,
T = 1024, micro-batch 4 per rank.

Two processes on one GPU take turns in time slices (a slice lasts milliseconds), so
without more an op's measured span can hold the other rank's slice: that is scheduling,
not contention for SMs. So both policies run twice when the machine allows it: as is
("time-sliced"), and under an MPS daemon started here (nvidia-cuda-mps-control), where
the two ranks' kernels share the SMs at the same time, as one process's compute and
communication kernels do. GPTC_BENCH_MPS=0 skips the MPS runs."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("GPTC_BUILD", os.path.join(ROOT, "build"))
# smoke tests on a CPU machine: GPTC_BENCH_EXTRA="--train.device=cpu --model.n_layer=1 ..."
EXTRA = os.environ.get("GPTC_BENCH_EXTRA", "").split()
OUT = os.environ.get("GPTC_BENCH_OUT", os.path.join(ROOT, "gpu-results", "bench_contention"))


def run(policy, tag="", env_extra=None):
    rep, trace = f"{OUT}/report_{tag}{policy}.json", f"{OUT}/trace_{tag}{policy}.json"
    args = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2",
            os.path.join(BUILD, "gptc-train"), os.path.join(ROOT, "configs", "gpt2-124m.ini"),
            "--model.n_layer=6", "--parallel.dp=2", "--train.global_batch=8", "--train.micro_batch=4",
            "--train.steps=9", f"--overlap.dp={policy}", "--overlap.dp_bucket_mb=25",
            "--profile.timing=kernel", "--profile.contention_probe=4", "--profile.warmup=1",
            f"--profile.report={rep}",
            f"--profile.trace={trace}", f"--data.path={OUT}/tokens.h5"] + EXTRA
    env = dict(os.environ, NCCL_MULTI_RANK_GPU_ENABLE="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **(env_extra or {}))
    r = subprocess.run(args, capture_output=True, text=True, timeout=150, env=env)
    with open(f"{OUT}/gptc_{tag}{policy}.log", "w") as f:
        f.write(r.stdout + r.stderr)
    if r.returncode:
        raise SystemExit(f"dp={policy}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    backend = re.search(r"^backend: .*$", r.stdout, re.M)
    return json.load(open(rep)), backend.group(0) if backend else "?"


def start_mps():
    """Starts an MPS control daemon of our own (its pipes in a fresh folder); returns the
    environment that connects a process to it, or None where MPS is not available."""
    ctl = shutil.which("nvidia-cuda-mps-control")
    if not ctl or os.environ.get("GPTC_BENCH_MPS", "1") == "0" or "--train.device=cpu" in EXTRA:
        return None
    d = tempfile.mkdtemp(prefix="gptc_mps_")
    env = {"CUDA_MPS_PIPE_DIRECTORY": f"{d}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{d}/log"}
    for v in env.values():
        os.makedirs(v, exist_ok=True)
    try:
        r = subprocess.run([ctl, "-d"], env=dict(os.environ, **env), capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"MPS did not start: {e}", file=sys.stderr)
        return None
    if r.returncode:
        print(f"MPS did not start: {r.stderr.strip()}", file=sys.stderr)
        return None
    return env


def stop_mps(env):
    try:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=dict(os.environ, **env),
                       capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"MPS did not stop: {e}", file=sys.stderr)


def table(lines, title, rep, backend):
    steps = [s for s in rep["steps"] if not s["probe"] and s["step"] > 1]
    mean = lambda k: sum(s[k] for s in steps) / max(len(steps), 1)  # noqa: E731
    lines.append(f"\n## {title}\n\n{backend}\n\n"
                 f"iter {mean('iter_ms'):.1f} ms, compute {mean('compute_ms'):.1f} ms, "
                 f"comm {mean('comm_ms'):.1f} ms, exposed comm {mean('exposed_comm_ms'):.1f} ms"
                 + (f", {mean('comm_wait_ms'):.1f} ms of it waiting for the other rank"
                    if steps and all(s.get("comm_wait_ms") is not None for s in steps) else "")
                 + " (mean over ranks and non-probe steps after the first)\n\n")
    # each parallelism's communication alone (the report's <par>_comm_ms), where it has any
    pars = [p for p in ("dp", "tp", "pp")
            if steps and f"{p}_comm_ms" in steps[0] and mean(f"{p}_comm_ms") > 0]
    if pars:
        lines.append("by parallelism: " + ", ".join(
            f"{p} comm {mean(p + '_comm_ms'):.1f} ms, exposed {mean(p + '_exposed_comm_ms'):.1f} ms"
            for p in pars) + "\n\n")
    # alone / beside comm: within the policy's own steps; probe: the same op in the
    # serialized probe steps of the same run, the baseline the policy is charged against
    # a communication op's slowdown is mostly its wait for a rank still computing: beside
    # it, the same net of those waits (the report's net_of_wait)
    lines.append("| kernel | count | alone / beside | mean us | alone us | beside comm us | "
                 "slowdown | excl wait | probe us | vs probe |\n"
                 "|---|---|---|---|---|---|---|---|---|---|\n")
    kernels = sorted(rep["kernels"], key=lambda k: -k["count"] * k["mean_us"])[:14]
    for k in kernels:
        fmt = lambda v: "" if v is None else f"{v:.1f}"  # noqa: E731
        ratio = lambda v: "" if v is None else f"{v:.3f}"  # noqa: E731
        net = k.get("net_of_wait") or {}
        lines.append(f"| {k['name']} | {k['count']} | {k.get('n_isolated', '')} / "
                     f"{k.get('n_overlapped', '')} | {k['mean_us']:.1f} | "
                     f"{fmt(k['isolated_mean_us'])} | {fmt(k['overlapped_mean_us'])} | "
                     f"{ratio(k['slowdown'])} | {ratio(net.get('slowdown'))} | "
                     f"{fmt(k.get('probe_mean_us'))} | {ratio(k.get('slowdown_vs_probe'))} |\n")
    # the device kernels behind the compute ops (CUPTI) that ran both alone and beside
    # communication: which of an op's kernels the contention slows (a communication op's
    # own kernels, as host staging's flag kernels, are split by compute beside them)
    comm_ops = {k["name"] for k in rep["kernels"] if k["kind"] == "comm"}
    dev = [d for d in rep.get("device_kernels", [])
           if d.get("slowdown") is not None and d["op"] not in comm_ops]
    dev = sorted(dev, key=lambda d: -d["count"] * d["mean_us"])[:14]
    if dev:
        lines.append("\nDevice kernels behind them (CUPTI), where some instances ran alone "
                     "and some beside communication:\n\n| op | kernel | count | alone us | "
                     "beside comm us | slowdown |\n|---|---|---|---|---|---|\n")
        for d in dev:
            name = d["kernel"]
            if len(name) > 70:  # long cuBLAS names: the start, then the end
                name = name[:33] + ".." + name[-35:]
            lines.append(f"| {d['op']} | `{name}` | {d['count']} | {d['isolated_mean_us']:.1f} | "
                         f"{d['overlapped_mean_us']:.1f} | {d['slowdown']:.3f} |\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    srcs = [os.path.join(ROOT, "engine", f) for f in sorted(os.listdir(os.path.join(ROOT, "engine")))
            if f.endswith(".c")]
    subprocess.run([os.path.join(BUILD, "gptc-data"), "--vocab", "50257", "--out",
                    f"{OUT}/tokens.h5"] + srcs, check=True, capture_output=True)
    lines = ["# Two DP ranks on one GPU: overlap.dp = none vs bucket\n"]
    for policy in ("none", "bucket"):
        rep, backend = run(policy)
        table(lines, f"dp = {policy}, time-sliced", rep, backend)
    mps = start_mps()
    if mps is None:
        lines.append("\n(no MPS runs: nvidia-cuda-mps-control is missing, would not start, or "
                     "GPTC_BENCH_MPS=0)\n")
    else:
        try:
            for policy in ("none", "bucket"):
                try:
                    rep, backend = run(policy, "mps_", mps)
                    table(lines, f"dp = {policy}, MPS", rep, backend)
                except (SystemExit, subprocess.TimeoutExpired) as e:
                    lines.append(f"\n## dp = {policy}, MPS\n\nfailed: {e}\n")
        finally:
            stop_mps(mps)
    text = "".join(lines)
    with open(f"{OUT}/contention.md", "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
