"""Crash-safe checkpoints: kill -9 a trainer that saves after every step, at random
moments, many times; whatever is at train.save always loads and training resumes from it.
And a save that runs out of room (a full disk: a file-size limit, and a full tmpfs where
root can mount one) ends the run with one line and exit 1, the checkpoint before it
untouched.

With the argument `mounts` (ctest test_crash_save_mounts), the checks that need root to
mount a small tmpfs or bind-mount a file, and only those: where a mount is refused (a
container without CAP_SYS_ADMIN), each says so and the test exits 77, which ctest shows
as skipped rather than passed."""
import contextlib
import errno
import hashlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import TRAIN, env, fail, run_train, work_dir, write_tokens  # noqa: E402

D = work_dir("gptc_crash_")
SKIPPED = []  # the checks a refused mount left out
# big enough that a save (model + two moments, ~50 MB) takes a good part of each step
MODEL = ["--model.n_layer=4", "--model.n_head=4", "--model.d_model=256", "--model.n_ctx=32",
         "--model.vocab_size=4096", f"--data.path={D}/tok.h5", "--train.global_batch=2",
         "--train.seq_len=32"]


def main():
    if sys.argv[1:] == ["mounts"]:
        check_full_tmpfs()
        check_full_outputs()
        check_bind_mounted()
        if SKIPPED:
            print(f"SKIPPED: {len(SKIPPED)} of 3 checks could not mount here: {SKIPPED}")
            sys.exit(77)
        print("PASS: full file systems and bind-mounted outputs end with one line")
        return
    write_tokens(f"{D}/tok.h5", np.random.default_rng(6).integers(0, 4096, 20000), 4096)
    ckpt = f"{D}/ckpt.h5"
    rnd = random.Random(11)
    steps_seen = set()
    # Kill times scale with how long this machine takes to start and write the first
    # checkpoint (a sanitizer build on a loaded 2-core machine is many times slower than
    # a release build): the first attempt measures it, the others kill at a random moment
    # between that and three times that (twice as long, up to 8 times the measure, after a
    # kill that found no newer save).
    first_save = None
    for attempt in range(8):
        p = subprocess.Popen([TRAIN, *MODEL, "--train.steps=1000", "--train.save_every=1",
                              f"--train.save={ckpt}"] + ([f"--train.init={ckpt}"] if os.path.exists(ckpt) else []),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env())
        if first_save is None:
            t0 = time.time()
            while not os.path.exists(ckpt) and p.poll() is None and time.time() - t0 < 300:
                time.sleep(0.02)
            first_save = measured = time.time() - t0
            time.sleep(rnd.uniform(0.0, first_save))
        else:
            time.sleep(rnd.uniform(first_save, 3 * first_save))
        p.send_signal(signal.SIGKILL)
        p.wait()
        if not os.path.exists(ckpt):
            continue  # killed before the first save completed: nothing to check yet
        with h5py.File(ckpt, "r") as f:
            step = int(f.attrs["step"])
            if "optim" not in f or int(f["optim"].attrs["t"]) != step:
                fail(f"attempt {attempt}: checkpoint of step {step} lacks its optimizer state")
        if step in steps_seen:
            # no save landed since the last kill: this machine (loaded, or a sanitizer
            # build) starts and resumes slower than the first attempt measured, so the
            # window grows until kills land after saves again
            first_save = min(2 * first_save, 8 * measured)
        steps_seen.add(step)
        r = run_train(MODEL + [f"--train.init={ckpt}", f"--train.steps={step + 1}"])
        if r.returncode:
            fail(f"attempt {attempt}: the checkpoint left by kill -9 does not resume:\n{r.stderr[-1500:]}")
    if len(steps_seen) < 3:
        fail(f"too few kills landed after a save to test anything: {sorted(steps_seen)}")
    # the partial copies the kills left are removed by the next run that saves there, and
    # only they: a user's file whose name merely starts the same way stays, digits that
    # are no pid too (a leading zero, a date: above Linux's largest pid, which kill() took
    # for a dead writer's)
    # (and those of the report, the trace and the metrics log, each written whole through
    # a temporary file too, a killed writer's by its pid; a live process's stays)
    mine = [f"{os.path.basename(ckpt)}.tmp.{x}"
            for x in ("notes", "0x10", "12a", "", "0", "007", "20251129")]
    mine += [f"{x}.tmp.{os.getpid()}" for x in ("report.json", "trace.json", "log.jsonl")]
    # a writer gone for good: no process has pid_max for its pid (pids stay below it),
    # where a child's pid, reaped, could be taken again before the run looked
    with open("/proc/sys/kernel/pid_max") as f:
        dead_pid = int(f.read())
    for x in ("report.json", "trace.json", "log.jsonl"):
        with open(os.path.join(D, f"{x}.tmp.{dead_pid}"), "w") as f:
            f.write("a killed writer's part\n")
    for x in mine:
        with open(os.path.join(D, x), "w") as f:
            f.write("a user's file\n")
    r = run_train(MODEL + [f"--train.init={ckpt}", f"--train.steps={max(steps_seen) + 1}",
                           f"--train.save={ckpt}", "--profile.timing=kernel",
                           f"--profile.report={D}/report.json", f"--profile.trace={D}/trace.json",
                           f"--train.log_file={D}/log.jsonl"])
    left = [x for x in os.listdir(D) if ".tmp." in x and x not in mine]
    if r.returncode or left:
        fail(f"stale temporary files after a clean save: {left}\n{r.stderr[-800:]}")
    gone = [x for x in mine if not os.path.exists(os.path.join(D, x))]
    if gone:
        fail(f"the clean-up of interrupted saves removed files that were not theirs: {gone}")
    for x in mine:
        os.remove(os.path.join(D, x))
    print(f"ok   8 kills at random moments; the checkpoint always loaded and resumed "
          f"(steps {sorted(steps_seen)}; first save after {first_save:.1f} s)")
    check_full_disk(ckpt)
    print("PASS: checkpoints survive kill -9 and a file-size limit")


def check_full_outputs():
    """The other outputs on a full file system (a small tmpfs, as above):
    - the timing report and trace replace the earlier run's only once whole: a run that
      cannot write them ends with one line naming profile.report and the cause, exit 1,
      the earlier files unchanged and no temporary file left (they were truncated, then
      torn);
    - gptc-data's --out the same (it wrote zeros over the earlier file, said it had
      written it, and exited 0);
    - the metrics file stays one JSON object a line: a line with no room is left out whole,
      and the run says how many were (a torn line stayed, and a later one carried on it)."""
    with small_tmpfs("outputs", "400k") as small:
        if small:
            outputs_on_full_tmpfs(small)


def check_bind_mounted():
    """Outputs that are bind-mounted files (a container's): a rename cannot replace a mount
    point (EBUSY). A checkpoint there is refused before training, naming it (it trained to
    the end and failed at the save); a report there is written in place, through the
    mount (it failed at the end)."""
    tiny = ["--model.n_layer=1", "--model.n_head=2", "--model.d_model=32",
            "--model.n_ctx=16", "--model.vocab_size=256", f"--data.path={D}/tok256b.h5",
            "--train.global_batch=4", "--train.seq_len=16", "--train.steps=2"]
    write_tokens(f"{D}/tok256b.h5", np.random.default_rng(10).integers(0, 256, 2000), 256)
    r = run_train(tiny[:-1] + ["--train.steps=0", f"--train.save={D}/src.h5"])
    if r.returncode:
        fail(f"cannot write a checkpoint to bind-mount: {r.stderr[-600:]}")
    open(f"{D}/ck.h5", "w").close()
    for name in ("src.json", "rep.json"):
        with open(f"{D}/{name}", "w") as f:
            f.write("{}\n")
    if subprocess.run(["mount", "--bind", f"{D}/src.h5", f"{D}/ck.h5"],
                      capture_output=True).returncode != 0:
        print("skip bind-mounted outputs: cannot bind-mount here (needs root)")
        SKIPPED.append("bind-mounted outputs")
        return
    try:
        subprocess.run(["mount", "--bind", f"{D}/src.json", f"{D}/rep.json"], check=True)
        r = run_train(tiny + [f"--train.save={D}/ck.h5"])
        lines = [x for x in r.stderr.splitlines() if x.startswith("gptc: error:")]
        if r.returncode == 0 or len(lines) != 1 or "mount point" not in lines[0] or \
                "step     1" in r.stdout:
            fail(f"train.save onto a bind-mounted file: exit {r.returncode}, {lines}")
        print(f"ok   train.save onto a bind-mounted file: {lines[0]}")
        r = run_train(tiny + ["--profile.timing=kernel", f"--profile.report={D}/rep.json"])
        with open(f"{D}/src.json") as f:
            rep = json.load(f)
        if r.returncode or "kernels" not in rep:
            fail(f"profile.report onto a bind-mounted file: exit {r.returncode}\n"
                 f"{r.stderr[-600:]}")
        print("ok   profile.report onto a bind-mounted file: written in place, through it")
    finally:
        subprocess.run(["umount", f"{D}/rep.json"], capture_output=True)
        subprocess.run(["umount", f"{D}/ck.h5"], capture_output=True)


def outputs_on_full_tmpfs(small):
    tiny = ["--model.n_layer=1", "--model.n_head=2", "--model.d_model=32",
            "--model.n_ctx=16", "--model.vocab_size=256", f"--data.path={D}/tok256o.h5",
            "--train.global_batch=4", "--train.seq_len=16"]
    write_tokens(f"{D}/tok256o.h5", np.random.default_rng(9).integers(0, 256, 2000), 256)
    prof = ["--profile.timing=kernel", f"--profile.report={small}/r.json",
            f"--profile.trace={small}/t.json"]
    text = f"{D}/corpus.txt"
    with open(text, "w") as f:
        f.write("the quick brown fox jumps over the lazy dog\n" * 2000)  # 88 KB
    gptc_data = [os.path.join(os.path.dirname(TRAIN), "gptc-data"), "--out", f"{small}/tok.h5",
                 text]
    r = run_train(tiny + ["--train.steps=2"] + prof)
    d = subprocess.run(gptc_data, capture_output=True, text=True, timeout=120)
    if r.returncode or d.returncode:
        fail(f"cannot write the first outputs on the tmpfs:\n{r.stderr[-800:]}{d.stderr}")
    before = {x: sha256(f"{small}/{x}") for x in ("r.json", "t.json", "tok.h5")}
    st = os.statvfs(small)  # leave one page free: a few metrics lines fit, no report
    with open(f"{small}/filler", "wb") as f:
        f.write(b"\0" * (st.f_bavail * st.f_frsize - 4096))
    r = run_train(tiny + ["--train.steps=20"] + prof)
    errors = [x for x in r.stderr.splitlines() if x.strip()]
    if r.returncode != 1 or len(errors) != 1 or "profile.report" not in errors[0] or \
            "No space left on device" not in errors[0]:
        fail(f"report on a full disk: exit {r.returncode} (want 1 and one line naming "
             f"profile.report and the cause):\n{r.stderr[-1500:]}")
    d = subprocess.run(gptc_data, capture_output=True, text=True, timeout=120)
    if d.returncode != 1 or "No space left on device" not in d.stderr:
        fail(f"gptc-data --out on a full disk: exit {d.returncode}, stderr:\n{d.stderr}")
    changed = [x for x, h in before.items() if sha256(f"{small}/{x}") != h]
    left = [x for x in os.listdir(small) if ".tmp" in x]
    if changed or left:
        fail(f"on a full disk the outputs {changed} changed, or {left} were left behind")
    print(f"ok   report, trace and gptc-data's --out on a full disk: exit 1, the earlier "
          f"files unchanged: {errors[0]}")
    log, steps = f"{small}/m.jsonl", 60
    r = run_train(tiny + [f"--train.steps={steps}", f"--train.log_file={log}"])
    with open(log) as f:
        lines = f.read().splitlines()
    try:
        logged = [json.loads(x)["step"] for x in lines]
    except ValueError as e:
        fail(f"metrics on a full disk: a line is no JSON object ({e}): {lines[-2:]}")
    lost = steps - len(logged)
    said = f"{lost} step line(s) could not be written"
    if r.returncode or logged != list(range(1, len(logged) + 1)) or lost <= 0 or \
            said not in r.stdout + r.stderr:
        fail(f"metrics on a full disk: exit {r.returncode}, steps {logged[:3]}..{logged[-3:]} "
             f"of {steps} (want 1.. in order, some lost, and '{said}' said):\n"
             f"{r.stderr[-1500:]}")
    print(f"ok   metrics on a full disk: steps 1 to {len(logged)} whole, {lost} lines left "
          f"out and counted")
    # no room at all: HDF5 makes the file, then cannot write its first block (the
    # cause was not said)
    fill_up(small)
    d = subprocess.run(gptc_data, capture_output=True, text=True, timeout=120)
    left = [x for x in os.listdir(small) if ".tmp" in x]
    if d.returncode != 1 or "No space left on device" not in d.stderr or left or \
            sha256(f"{small}/tok.h5") != before["tok.h5"]:
        fail(f"gptc-data --out with no room left: exit {d.returncode}, left {left}, "
             f"stderr:\n{d.stderr}")
    print(f"ok   gptc-data's --out with no room left: {d.stderr.strip()}")


def fill_up(directory):
    """Takes every free block of the file system under directory"""
    fd = os.open(os.path.join(directory, "fill_up"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while os.write(fd, b"\0" * 65536) > 0:
            pass
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def expect_failed_save(name, ckpt, run, cause):
    """run() saves over ckpt and must fail: exit 1, one line naming train.save and cause,
    ckpt byte-identical, no temporary file left beside it."""
    before = sha256(ckpt)
    r = run()
    errors = [x for x in r.stderr.splitlines() if x.strip()]
    left = [x for x in os.listdir(os.path.dirname(ckpt)) if ".tmp." in x]
    if r.returncode != 1 or len(errors) != 1 or "train.save" not in errors[0] or \
            cause not in errors[0]:
        fail(f"{name}: exit {r.returncode} (want 1 and one line naming train.save and "
             f"'{cause}'), stderr:\n{r.stderr[-1500:]}")
    if sha256(ckpt) != before or left:
        fail(f"{name}: the failed save changed the checkpoint or left {left}")
    print(f"ok   {name}: exit 1, one line: {errors[0]}")


def check_full_disk(ckpt):
    """Writes past RLIMIT_FSIZE fail with EFBIG (gptc-train ignores SIGXFSZ itself: the
    signal killed it, exit 153 and no word, until it did), as a full disk fails with ENOSPC:
    HDF5 then fails to write the temporary checkpoint."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # as a shell leaves it
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))  # MPI start-up needs a few MB

    with h5py.File(ckpt, "r") as f:
        step = int(f.attrs["step"])
    expect_failed_save(
        "a save past the file-size limit", ckpt,
        lambda: subprocess.run([TRAIN, *MODEL, f"--train.init={ckpt}", f"--train.steps={step + 1}",
                                f"--train.save={ckpt}"], capture_output=True, text=True,
                               env=env(), preexec_fn=limit, timeout=600),
        "File too large")


def check_full_tmpfs():
    """A full file system, where HDF5 finds out only when it flushes the file at close
    (a small model's datasets sit in its caches until then): HDF5 1.10 then keeps the
    file half closed, and its exit handler crashed the process (signal 11) until
    ckpt_library_init. Needs root to mount a small tmpfs; says so and skips without."""
    with small_tmpfs("small", "700k") as small:
        if not small:
            return
        tiny = ["--model.n_layer=2", "--model.n_head=2", "--model.d_model=32",
                "--model.n_ctx=16", "--model.vocab_size=256", f"--data.path={D}/tok256.h5",
                "--train.global_batch=4", "--train.micro_batch=2", "--train.seq_len=16"]
        write_tokens(f"{D}/tok256.h5", np.random.default_rng(7).integers(0, 256, 2000), 256)
        ck = f"{small}/ck.h5"
        r = run_train(tiny + ["--train.steps=2", f"--train.save={ck}"])
        if r.returncode:
            fail(f"cannot write the first checkpoint on the tmpfs:\n{r.stderr[-800:]}")
        expect_failed_save(
            "a save onto a full file system", ck,
            lambda: run_train(tiny + [f"--train.init={ck}", "--train.steps=4",
                                      "--train.save_every=1", f"--train.save={ck}"]),
            "No space left on device")
        # no room at all: HDF5 made the temporary file, failed at its first block and left
        # it, empty, with no cause said
        fill_up(small)
        expect_failed_save(
            "a save onto a file system with no room left", ck,
            lambda: run_train(tiny + [f"--train.init={ck}", "--train.steps=3",
                                      f"--train.save={ck}"]),
            "No space left on device")


@contextlib.contextmanager
def small_tmpfs(name, size):
    """A tmpfs of size mounted at D/name for the with block, or None where it cannot be
    mounted (it needs root), which is said"""
    small = f"{D}/{name}"
    os.makedirs(small)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", small],
                      capture_output=True).returncode != 0:
        print(f"skip the full file system {name}: cannot mount a tmpfs here (needs root)")
        SKIPPED.append(f"full file system {name}")
        yield None
        return
    try:
        yield small
    finally:
        subprocess.run(["umount", small], capture_output=True)


if __name__ == "__main__":
    main()
