"""The CPU layout configs (configs/tiny-*.ini) train, and as configs/tiny.ini does.

Each says its losses are tiny.ini's: the same model, seed, data order and optimizer on
another layout with its overlap policies on (DESIGN section 3). Three steps of each, under
mpirun with the ranks its name gives, must match tiny.ini's single-rank run to 1e-5
relative (losses and grad norms, and the final parameters normwise, each tensor to
TENSOR_RTOL), and write the kernel-timing report the config asks for, with a row for every
rank and step. The outputs go to a temporary directory, not to the configs' build/ paths.

The runs take one warm-up step, not the configs' 40: three steps of a 40-step warm-up
move the parameters by ~1e-4 of lr, under the noise an optimizer bug would have to beat
(ZeRO-1 leaving out the weight decay of every shard but rank 0's moved tiny-dp2's losses
by 3e-6 and passed; at the full rate by 2.5e-5). Measured at the full rate: losses and
grad norms within 7.9e-7, parameters within 1.0e-6 normwise, each tensor within ~5e-5
(the key biases, whose gradient is zero but for rounding: gptc_testlib.compare_params).
The tokens are tests/*.py made into a token file, so these figures move a little when a
test file changes.
"""
import glob
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import (BUILD, compare_metrics, compare_params, fail,  # noqa: E402
                          read_metrics, run_train, work_dir)

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "configs")
STEPS = 3
RTOL = 1e-5
TENSOR_RTOL = 5e-4


def ranks_of(name):
    """The world a file's name gives: the product of its tpN, ppN, dpN parts."""
    world = 1
    for n in re.findall(r"-(?:tp|pp|dp)(\d+)", name):
        world *= int(n)
    return world


def train(config, d, ranks):
    """Trains config for STEPS steps with every output under d; returns the metrics."""
    name = os.path.basename(config)[:-4]
    args = [config, f"--train.steps={STEPS}", "--train.warmup_steps=1", f"--data.path={d}/tok.h5",
            f"--train.log_file={d}/{name}.jsonl", f"--train.save={d}/{name}.h5",
            "--train.save_every=0"]
    with open(config) as f:
        has_report = re.search(r"^report\s*=", f.read(), re.M) is not None
    if has_report:
        args.append(f"--profile.report={d}/{name}_report.json")
    r = run_train(args, np_ranks=ranks if ranks > 1 else None)
    if r.returncode:
        fail(f"{name}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    if has_report:
        with open(f"{d}/{name}_report.json") as f:
            report = json.load(f)
        rows = {(s["step"], s["rank"]) for s in report["steps"]}
        want = {(s, k) for s in range(1, STEPS + 1) for k in range(ranks)}
        if rows != want:
            fail(f"{name}: report step rows {sorted(rows)}, not one per rank and step")
        kinds = {k["kind"] for k in report["kernels"]}
        if ranks > 1 and kinds != {"compute", "comm"}:
            fail(f"{name}: report kernels of kinds {kinds}, not compute and comm")
    return read_metrics(f"{d}/{name}.jsonl")


def main():
    layouts = sorted(glob.glob(os.path.join(CONFIGS, "tiny-*.ini")))
    if not layouts:
        fail(f"no configs/tiny-*.ini in {CONFIGS}")
    d = work_dir("gptc_configs_")
    # tiny.ini's data is the demo's license texts: any text trains the same way here
    texts = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "*.py")))
    subprocess.run([os.path.join(BUILD, "gptc-data"), "--out", f"{d}/tok.h5", *texts],
                   check=True, capture_output=True)
    ref = train(os.path.join(CONFIGS, "tiny.ini"), d, 1)
    for config in layouts:
        name = os.path.basename(config)[:-4]
        got = train(config, d, ranks_of(name))
        worst = compare_metrics(name, ref, got, RTOL, "tiny.ini")
        params = compare_params(name, f"{d}/tiny.h5", f"{d}/{name}.h5", RTOL, TENSOR_RTOL,
                                "tiny.ini")
        print(f"ok   {name:<20} {ranks_of(name)} ranks, worst relative difference "
              f"{worst:.2e}, final parameters {params:.2e}")
    print(f"all {len(layouts)} layout configs train as tiny.ini")


if __name__ == "__main__":
    main()
