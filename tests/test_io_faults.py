"""One transient I/O error (tests/fail_io.c, preloaded, fails the chosen read or write of a
chosen file with EIO). Anywhere in a checkpoint's save: the run ends with exit 1 and one
line naming train.save and the cause, the checkpoint at train.save is the one from before,
byte for byte, and no temporary file is left. HDF5 keeps a small dataset's bytes until the
dataset is closed; that close's failure went unchecked, and a save that had lost a tensor
(zeros in its place) said "saved" and exited 0, over the good checkpoint.

Every write of a one-rank save of a plain initialisation is failed in turn (its datasets,
attributes and HDF5's metadata), then writes spread over a step's save with the optimizer
state, and over a tp2 one (rank 0 writes what rank 1 sends): there one line in all, from
the rank that failed, also where rank 1's own part failed (its staging copy out of memory,
GPTC_TEST_SAVE_NO_MEMORY). Anywhere in the reads of the token file (the start-up's checks, the
loader's reads), or of train.init's: exit 1 and one line naming the file and the cause.

    test_io_faults.py FAIL_IO_SO [--quick]

--quick (the sanitizer builds) fails every third write of the initialisation's save."""
import hashlib
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import fail, run_train, work_dir, write_tokens  # noqa: E402

D = work_dir("gptc_io_faults_")
MODEL = ["--model.n_layer=1", "--model.n_head=2", "--model.d_model=32", "--model.n_ctx=16",
         "--model.vocab_size=64", f"--data.path={D}/tok.h5", "--train.global_batch=4",
         "--train.micro_batch=2", "--train.seq_len=16", "--train.log_file="]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def shim_env(shim, op, path, at=None):
    # a sanitizer's runtime wants to be first of the preloaded libraries: not checked, the
    # shim only forwards the calls
    e = {"LD_PRELOAD": shim, "GPTC_FAIL_OP": op, "GPTC_FAIL_PATH": path,
         "ASAN_OPTIONS": ":".join(x for x in (os.environ.get("ASAN_OPTIONS"),
                                               "verify_asan_link_order=0") if x)}
    if at is not None:
        e["GPTC_FAIL_AT"] = str(at)
    return e


def shim_counts(stderr):
    """(the most calls one process saw, whether one was failed) from fail_io's lines,
    "fail_io: pid P: N calls, failed F" (the writer's; any other process saw none)"""
    counts = [line.split() for line in stderr.splitlines() if line.startswith("fail_io:")]
    return max(int(c[3]) for c in counts) if counts else 0, any(c[6] == "1" for c in counts)


def save(shim, ranks, args, at=None):
    """Runs args, which save at ck.h5, over a copy of base.h5 there, writes failed as at
    says; returns (CompletedProcess, writes seen, whether one failed)."""
    shutil.copy(f"{D}/base.h5", f"{D}/ck.h5")
    r = run_train(MODEL + [f"--train.save={D}/ck.h5", *args], np_ranks=ranks if ranks > 1 else None,
                  timeout=120, extra_env=shim_env(shim, "write", "ck.h5.tmp.", at))
    return (r, *shim_counts(r.stderr))


def count_writes(shim, ranks, args):
    """the writes of args' save without a fault, which must go well"""
    r, writes, failed = save(shim, ranks, args)
    if r.returncode or failed or writes < 10 or sha256(f"{D}/ck.h5") == sha256(f"{D}/base.h5"):
        fail(f"{args}: without a fault: exit {r.returncode}, {writes} writes seen, failed "
             f"{failed}:\n{r.stderr[-1500:]}")
    return writes


def one_line(name, r, failed, names):
    """exit 1 and one gptc line naming names and the cause; returns that line"""
    if not failed:
        fail(f"{name}: the shim failed no call (stderr:\n{r.stderr[-1500:]})")
    lines = [x for x in r.stderr.splitlines() if x.startswith("gptc")]
    # the system's words, not HDF5's whole description of the read (a time, a buffer's
    # address, "(truncated or damaged?)")
    if r.returncode != 1 or len(lines) != 1 or names not in lines[0] or \
            "Input/output error" not in lines[0] or "file read failed" in lines[0]:
        fail(f"{name}: exit {r.returncode}, want 1 and one line naming '{names}' and "
             f"'Input/output error', without HDF5's 'file read failed: ...'; stderr:\n"
             f"{r.stderr[-2000:]}")
    return lines[0]


def check_failed(name, r, failed):
    """one_line naming train.save, ck.h5 as it was, nothing left"""
    line = one_line(name, r, failed, f"train.save {D}/ck.h5")
    left = [x for x in os.listdir(D) if ".tmp." in x]
    if sha256(f"{D}/ck.h5") != sha256(f"{D}/base.h5") or left:
        fail(f"{name}: the failed save changed the checkpoint before it, or left {left}")
    return line


def check_token_reads(shim):
    """The token file's reads (the start-up's checks of the file and its stamp, HDF5's reads
    of its metadata and of the tokens), each failed in turn: one line naming the cause (a
    failed read said "not an HDF5 file", "no dataset /tokens", "/tokens is not a dataset"
    or nothing)"""
    args = MODEL + ["--train.steps=3"]
    r = run_train(args, timeout=120, extra_env=shim_env(shim, "read", "tok.h5"))
    reads, failed = shim_counts(r.stderr)
    if r.returncode or failed or reads < 10:
        fail(f"token reads without a fault: exit {r.returncode}, {reads} reads:\n{r.stderr[-1500:]}")
    for at in range(1, reads + 1):
        r = run_train(args, timeout=120, extra_env=shim_env(shim, "read", "tok.h5", at))
        line = one_line(f"token read {at} of {reads} failed", r, shim_counts(r.stderr)[1],
                        f"data.path {D}/tok.h5")
    print(f"ok   each of the token file's {reads} reads failed in turn: exit 1, one line; "
          f"e.g. {line}")


def check_init_reads(shim):
    """train.init's reads, a spread of them failed (its metadata, /model, /optim): one line
    naming the file and the cause (the check that made the read said "missing dataset",
    "is not a dataset" or "/optim is not a group")"""
    args = MODEL + [f"--train.init={D}/base.h5", "--train.steps=2"]
    r = run_train(args, timeout=120, extra_env=shim_env(shim, "read", "base.h5"))
    reads, failed = shim_counts(r.stderr)
    if r.returncode or failed or reads < 10:
        fail(f"train.init's reads without a fault: exit {r.returncode}, {reads} reads:\n"
             f"{r.stderr[-1500:]}")
    # every read of HDF5's open (its first few: it said "HDF5 cannot open the file: file
    # read failed: time = ..., buf = 0x..." and "(truncated or damaged?)"), then a spread
    ats = sorted(set(range(1, 9)) | {1 + (reads - 1) * k // 16 for k in range(17)})
    for at in ats:
        r = run_train(args, timeout=120, extra_env=shim_env(shim, "read", "base.h5", at))
        line = one_line(f"train.init read {at} of {reads} failed", r, shim_counts(r.stderr)[1],
                        f"train.init {D}/base.h5")
    print(f"ok   train.init's reads {ats} of {reads} failed: exit 1, one line; e.g. {line}")


def check_listing_read(shim):
    """The listing of /model's datasets the model has no use for, after the load, failed at
    a read: one line naming the file and the cause (the failed listing counted what it had
    got to, "1994 dataset(s) ... left out" of 2000, and the run went on with exit 0)"""
    import h5py
    shutil.copy(f"{D}/base.h5", f"{D}/extra.h5")
    with h5py.File(f"{D}/extra.h5", "a") as f:
        for i in range(2000):  # enough that the listing reads what the load did not
            f[f"model/extra_{i:04d}"] = np.zeros(1, np.float32)
    args = MODEL + [f"--train.init={D}/extra.h5", "--train.steps=1"]
    r = run_train(args, timeout=120, extra_env=shim_env(shim, "read", "extra.h5"))
    reads, failed = shim_counts(r.stderr)
    if r.returncode or failed or "2000 dataset(s) under /model" not in r.stdout + r.stderr:
        fail(f"extra.h5 without a fault: exit {r.returncode}, want 0 and 2000 datasets left "
             f"out:\n{r.stdout[-1000:]}\n{r.stderr[-1500:]}")
    r = run_train(args, timeout=120, extra_env=shim_env(shim, "read", "extra.h5", reads))
    line = one_line(f"extra.h5's last read, of {reads}, failed", r, shim_counts(r.stderr)[1],
                    f"train.init {D}/extra.h5")
    print(f"ok   the last of extra.h5's {reads} reads (the listing of /model) failed: exit 1, "
          f"one line: {line}")


def main():
    args = [a for a in sys.argv[1:] if a != "--quick"]
    if len(args) != 1:
        fail("usage: test_io_faults.py FAIL_IO_SO [--quick]")
    shim = os.path.abspath(args[0])
    write_tokens(f"{D}/tok.h5", np.random.default_rng(3).integers(0, 64, 2000), 64)
    r = run_train(MODEL + ["--train.steps=1", f"--train.save={D}/base.h5"], timeout=120)
    if r.returncode:
        fail(f"the first run: exit {r.returncode}\n{r.stderr[-1500:]}")

    # a plain initialisation's save (no optimizer state: 30 writes), each write failed in
    # turn: the datasets, the attributes, HDF5's metadata at the flush
    init = ["--train.steps=0"]
    writes = count_writes(shim, 1, init)
    ats = range(1, writes + 1, 3 if "--quick" in sys.argv else 1)
    for at in ats:
        r, _, failed = save(shim, 1, init, at)
        line = check_failed(f"one rank's initial save, write {at} of {writes} failed", r, failed)
    print(f"ok   one rank's initial save: {len(ats)} of its {writes} writes failed in turn: "
          f"exit 1, one line, the checkpoint before kept; e.g. {line}")

    # a step's save with the optimizer state, going on from base.h5: writes spread over it
    step2 = [f"--train.init={D}/ck.h5", "--train.steps=2"]
    writes = count_writes(shim, 1, step2)
    ats = sorted({1 + (writes - 1) * k // 6 for k in range(7)})
    for at in ats:
        r, _, failed = save(shim, 1, step2, at)
        check_failed(f"one rank's step-2 save, write {at} of {writes} failed", r, failed)
    print(f"ok   one rank's step-2 save (with /optim): writes {ats} of {writes} failed: exit 1, "
          f"one line, the checkpoint before kept")

    # tp2: rank 0 writes rank 1's slabs too; the first, a middle and the last write
    tp2 = step2 + ["--parallel.tp=2"]
    writes = count_writes(shim, 2, tp2)
    for at in sorted({1, writes // 2, writes}):
        r, _, failed = save(shim, 2, tp2, at)
        line = check_failed(f"tp2, write {at} of {writes} failed", r, failed)
        if not line.startswith("gptc: error: rank 0: "):
            fail(f"tp2, write {at}: the line is not rank 0's own: {line}")
    print(f"ok   tp2: writes 1, {writes // 2} and {writes} of {writes} failed: one line, "
          f"rank 0's: {line}")
    # tp2, rank 1's own part failed (its staging copy, GPTC_TEST_SAVE_NO_MEMORY): rank 1
    # alone says so; rank 0, which had begun the file, drops it
    shutil.copy(f"{D}/base.h5", f"{D}/ck.h5")
    r = run_train(MODEL + [f"--train.save={D}/ck.h5", *tp2], np_ranks=2, timeout=120,
                  extra_env={"GPTC_TEST_SAVE_NO_MEMORY": "1"})
    lines = [x for x in r.stderr.splitlines() if x.startswith("gptc")]
    left = [x for x in os.listdir(D) if ".tmp." in x]
    if r.returncode == 0 or lines != [f"gptc: error: rank 1: train.save {D}/ck.h5: out of host "
                                      f"memory"] or sha256(f"{D}/ck.h5") != sha256(f"{D}/base.h5") \
            or left:
        fail(f"tp2, rank 1 out of memory for its part: exit {r.returncode}, lines {lines}, "
             f"the checkpoint before kept: {sha256(f'{D}/ck.h5') == sha256(f'{D}/base.h5')}, "
             f"left {left}; stderr:\n{r.stderr[-2000:]}")
    print(f"ok   tp2, rank 1's part failed: one line, rank 1's: {lines[0]}")
    check_token_reads(shim)
    check_init_reads(shim)
    check_listing_read(shim)
    print("PASS: a failed write of a save, or a failed read of the tokens, ends the run with "
          "one line; a save keeps the checkpoint before it")


if __name__ == "__main__":
    main()
