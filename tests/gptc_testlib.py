"""Shared helpers for the end-to-end tests: run the built binaries, make small inputs."""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

BUILD = os.environ.get("GPTC_BUILD", os.path.join(os.path.dirname(__file__), "..", "build"))
# GPTC_TRAIN: another trainer binary (e.g. build/tests/gptc-train-emu, the CUDA host code
# on a fake CUDA runtime); run_train's train= argument picks one per call
TRAIN = os.environ.get("GPTC_TRAIN", os.path.join(BUILD, "gptc-train"))
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]


def env(ranks=1):
    e = dict(os.environ)
    # 2 cores: one thread per rank when several ranks share them, else busy-waiting
    # OpenMP threads of one rank steal the cores the other ranks need
    e["OMP_NUM_THREADS"] = "1" if ranks > 1 else e.get("OMP_NUM_THREADS", "2")
    # the tests of HDF5's file locks want them on, whatever the caller's setting
    e.pop("HDF5_USE_FILE_LOCKING", None)
    e["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    e["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return e


def run_train(args, np_ranks=None, timeout=600, extra_env=None, train=None):
    """Runs gptc-train, or the binary train (under mpirun when np_ranks is given); returns
    CompletedProcess. extra_env's None values unset theirs."""
    cmd = ([*MPIRUN, "-np", str(np_ranks)] if np_ranks else []) + [train or TRAIN, *args]
    e = env(np_ranks or 1)
    for k, v in (extra_env or {}).items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)


def train_tiny(d, name, ranks, device, extra, steps, vocab, binary=None, extra_env=None,
               refused=("cuda_emu",), timeout=300):
    """Trains the tiny GPT-2 of the device tests (4 layers, d_model 64 unless extra says
    otherwise, 8 rows of 32 tokens in micro-batches of 2, warm-up and cosine decay,
    clipping) on the tokens in d/tok.h5, saving to d/name.h5, with gptc-train or binary.
    Fails on a nonzero exit, or when stderr holds one of refused (a fake library
    complained, even if the engine went on). Returns (metrics, CompletedProcess, seconds)."""
    log = f"{d}/{name}.jsonl"
    args = ["--model.n_layer=4", "--model.n_head=4", "--model.d_model=64", "--model.n_ctx=32",
            f"--model.vocab_size={vocab}", f"--data.path={d}/tok.h5", f"--train.steps={steps}",
            "--train.global_batch=8", "--train.micro_batch=2", "--train.seq_len=32",
            "--train.lr=3e-3", "--train.warmup_steps=1", "--train.lr_schedule=cosine",
            "--train.grad_clip=0.5", f"--train.log_file={log}", f"--train.device={device}",
            f"--train.save={d}/{name}.h5"] + extra
    t0 = time.time()
    r = run_train(args, np_ranks=ranks if ranks > 1 else None, timeout=timeout,
                  extra_env=extra_env, train=binary)
    if r.returncode:
        fail(f"{name}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    for who in refused:
        if who in r.stderr:
            fail(f"{name}: the fake complained:\n{r.stderr[-3000:]}")
    return read_metrics(log), r, time.time() - t0


def gpu_present():
    """True when nvidia-smi lists a GPU (the GPU tests run only then)."""
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "GPU" in r.stdout


def write_tokens(path, tokens, vocab_size):
    import h5py
    with h5py.File(path, "w") as f:
        f.create_dataset("tokens", data=np.asarray(tokens, dtype=np.uint16))
        f.attrs["vocab_size"] = np.int64(vocab_size)


def read_metrics(path, partial_ok=False):
    """The JSON lines of path. partial_ok: the file is still being written; a last line
    not ended yet (a line over a page boundary shows a page at a time) is left out."""
    with open(path) as f:
        lines = f.read().split("\n")
    if partial_ok:
        lines = lines[:-1]
    return [json.loads(line) for line in lines if line.strip()]


def compare_metrics(name, ref, got, rtol, ref_name):
    """Fails unless got has ref's steps, and each loss and grad norm within rtol relative
    of ref's; returns the worst relative difference."""
    if [m["step"] for m in got] != [m["step"] for m in ref]:
        fail(f"{name}: steps {[m['step'] for m in got]} != {[m['step'] for m in ref]}")
    worst = 0.0
    for a, b in zip(ref, got):
        for k in ("loss", "grad_norm"):
            rel = abs(a[k] - b[k]) / abs(a[k])
            worst = max(worst, rel)
            if not rel <= rtol:
                fail(f"{name}: step {a['step']} {k} {b[k]!r} vs {ref_name} {a[k]!r} (rel {rel:.2e})")
    return worst


def compare_params(name, ref_path, got_path, rtol, tensor_rtol, ref_name="the CPU run",
                   groups=("model",)):
    """Final parameters of two checkpoints, normwise: over the whole model within rtol and
    per tensor within tensor_rtol; returns the whole model's difference (the largest over
    groups, which may add the optimizer state: "optim/m", "optim/v"). Not element by
    element: AdamW turns rounding noise in a gradient that is (almost) zero into steps of
    its own sign (m / sqrt(v)), so such elements differ between any two summation orders
    far more than the rest (the key biases, whose gradient is exactly zero in exact
    arithmetic, by ~1e-4 of the tensor's norm even between two CPU layouts' runs); a
    wrong tensor or shard is off by far more."""
    import h5py
    worst = 0.0
    with h5py.File(ref_path) as fr, h5py.File(got_path) as fg:
        for grp in groups:
            if sorted(fr[grp]) != sorted(fg[grp]):
                fail(f"{name}: /{grp} holds {sorted(fg[grp])}, {ref_name}'s {sorted(fr[grp])}")
            num = den = 0.0
            for t in fr[grp]:
                a = fr[grp][t][...].astype(np.float64)
                b = fg[grp][t][...].astype(np.float64)
                if a.shape != b.shape:
                    fail(f"{name}: final /{grp}/{t} has shape {b.shape}, {ref_name}'s {a.shape}")
                d2, a2 = float(np.sum((a - b) ** 2)), float(np.sum(a * a))
                num, den = num + d2, den + a2
                err = (d2 / max(a2, 1e-300)) ** 0.5
                if not err <= tensor_rtol:
                    fail(f"{name}: final /{grp}/{t} differs from {ref_name} by {err:.2e} (normwise)")
            err = (num / den) ** 0.5
            if not err <= rtol:
                fail(f"{name}: final /{grp} differs from {ref_name} by {err:.2e} (normwise)")
            worst = max(worst, err)
    return worst


def tensors_differ(path_a, path_b):
    """Checkpoint path_a's tensors (/model, /optim/m, /optim/v) that path_b does not hold
    bit for bit ("group/name", one missing there included), and how many were compared."""
    import h5py
    differ, n = [], 0
    with h5py.File(path_a) as fa, h5py.File(path_b) as fb:
        for group in ("model", "optim/m", "optim/v"):
            for name in fa[group]:
                key, n = f"{group}/{name}", n + 1
                if key not in fb or not np.array_equal(fa[key][()], fb[key][()]):
                    differ.append(key)
    return differ, n


# precision = bf16 across devices: a bf16 run against the CPU's bf16 run of the same
# layout. Each op's bf16 outputs may differ between devices by one bf16 step where their
# fp32 sums add in another order (and the flash attention rounds its probabilities
# against a running row max, the CPU against the final one), and AdamW's steps of ~lr
# grow such flips over a run. Measured over 5 steps (the tiny model of
# test_cuda_fake_train, lr 3e-3), worst relative difference of the grad norm: the
# emulator against the CPU 1.4e-3 on one rank and 1.2e-3 with tp2, the CPU's tp2 against
# its one rank 2.0e-3, the emulator's 3.1e-3 (and before the loss recomputed its
# probabilities, up to 2.9e-3 between devices). That is bf16's noise floor here, so every
# step is held to twice it, BF16_RTOL (at 3e-3 a real GPU's other flips would fail at
# random); step 1, before AdamW grows them (measured 1.2e-4 to 1.3e-4 between devices),
# to BF16_STEP1. A buffer read as the wrong type is off by far more. That the
# device really rounds where it should is shown op by op (test_cuda_ops): in a whole run,
# a missing rounding moves the numbers about as much as the flips do.
BF16_RTOL = 6e-3
BF16_STEP1 = 1e-3


def compare_bf16_run(name, ref_bf16, got):
    """Fails unless got (a bf16 run on another device) matches the CPU's bf16 run ref_bf16
    as above; returns the worst relative difference."""
    worst = compare_metrics(name, ref_bf16, got, BF16_RTOL, "the CPU's bf16 run")
    for key in ("loss", "grad_norm"):
        a, b = ref_bf16[0][key], got[0][key]
        if not abs(a - b) <= BF16_STEP1 * abs(a):
            fail(f"{name}: step 1 {key} {b!r} vs the CPU's bf16 run's {a!r}: beyond {BF16_STEP1}")
    return worst


_DIRS = []      # the test's directories (work_dir)
_FAILED = False  # fail() was called, or an exception ended the test


def work_dir(prefix):
    """A fresh directory for a test's files (checkpoints, token files, traces: a test can
    leave a gigabyte), removed when the test ends well and kept, with a line naming it,
    when it fails: run after run, a suite that left them filled the disk."""
    d = tempfile.mkdtemp(prefix=prefix)
    _DIRS.append(d)
    return d


def _remove_dirs():
    for d in _DIRS:
        if _FAILED:
            print(f"(the test's files are kept in {d})")
        else:
            shutil.rmtree(d, ignore_errors=True)


def _note_exception(kind, value, tb, previous=sys.excepthook):
    global _FAILED
    _FAILED = True
    previous(kind, value, tb)


atexit.register(_remove_dirs)
sys.excepthook = _note_exception


def fail(msg):
    global _FAILED
    _FAILED = True
    print("FAIL: " + msg)
    sys.exit(1)
