"""Start-up checks that depend on more than the config text: ranks that do not see the same
arguments or files (mpirun A : B, a file one node lacks), and output paths that pass
access() but cannot be written (or would block). Every case must end every rank with a
nonzero exit and one gptc line naming the rank, the key or the file, before training."""
import ctypes
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import MPIRUN, TRAIN, env, fail, run_train, work_dir, write_tokens  # noqa: E402

D = work_dir("gptc_start_")
DATA = os.path.join(os.path.dirname(TRAIN), "gptc-data")  # the trainer's sibling
CFG = """[model]
n_layer = 2
n_head = 2
d_model = 32
n_ctx = 16
vocab_size = 64

[train]
steps = 2
global_batch = 4
seq_len = 16

[data]
path = {tok}
"""


def gptc_lines(text):
    return [x for x in text.splitlines() if x.startswith("gptc: error:")]


def mpmd(apps, timeout=120):
    """mpirun with one app context per (wdir, extra args): rank i runs apps[i]."""
    cmd = list(MPIRUN)
    for i, (wdir, extra) in enumerate(apps):
        cmd += ([":"] if i else []) + ["-np", "1", "-wdir", wdir, TRAIN, "cfg.ini", *extra]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=env(len(apps)))
    except subprocess.TimeoutExpired:
        fail(f"hang: {' '.join(cmd)}")


def check_slow_peer(a):
    """Rank 1 reads the tokens (its start-up check) or the checkpoint (train.init) slower
    than rank 0 (GPTC_TEST_SLOW_READS: a cold cache, another node's disk) by more than
    train.comm_timeout_s: rank 0, waiting for it at their next meeting, must hold its
    watchdog for the time a slow disk takes to read those bytes (GPTC_TEST_IO_RATE makes
    that disk 16 KiB/s), not take the wait for a hang. Rank 1 beats as its reads go on.
    Each run is timed, so that a hold that did nothing (rank 1 fast after all) fails too."""
    timeout_s = 2
    for what, slow_ms, extra in (("tokens", 3000, []),  # its half of the file in one read
                                 ("checkpoint", 100, [f"--train.init={a}/ck.h5"])):  # 28: 2.8 s
        cmd = list(MPIRUN)
        for rank in (0, 1):
            cmd += ([":"] if rank else []) + ["-np", "1", "-wdir", a, "env", "GPTC_TEST_IO_RATE=16384"]
            cmd += [f"GPTC_TEST_SLOW_READS={slow_ms}"] if rank else []
            cmd += [TRAIN, "cfg.ini", f"--train.comm_timeout_s={timeout_s}", *extra]
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env(2))
        took = time.monotonic() - t0
        if r.returncode or "done:" not in r.stdout or took < 2.5:
            fail(f"rank 1 reads the {what} slowly: exit {r.returncode} after {took:.1f} s:\n"
                 f"{(r.stdout + r.stderr)[-1500:]}")
        print(f"ok   rank 1 reads the {what} {took:.1f} s slowly, rank 0 waits: trains")


def check_corrupt_checkpoint(a):
    """A checkpoint with one byte of its global heap (where the 'format' string lives)
    changed made HDF5 1.10 read past a buffer (a segfault: no word of gptc's) or loop
    forever (the start-up had no watchdog); h5py hangs on it too. On one rank and two,
    each run must end nonzero within train.comm_timeout_s and some slack, with a gptc line
    naming train.init and the file (the crash's line, the watchdog's, or, with an HDF5
    that reads it safely, a refusal). And a crash while reading (SIGSEGV sent while a
    slowed load runs: no HDF5 bug needed) says what the rank was reading."""
    ck = open(f"{a}/ck.h5", "rb").read()
    at = ck.find(b"GCOL")
    if at < 0:
        fail("the checkpoint has no global heap (GCOL) to corrupt")
    for name, byte, change in (("crash", 30, lambda b: 0x10), ("loop", 24, lambda b: b ^ 0x80)):
        bad = bytearray(ck)
        bad[at + byte] = change(bad[at + byte])
        path = f"{a}/corrupt-{name}.h5"
        open(path, "wb").write(bad)
        for ranks in (1, 2):
            cmd = [*MPIRUN, "-np", "2", TRAIN] if ranks == 2 else [TRAIN]
            cmd += [f"{a}/cfg.ini", f"--train.init={path}", "--train.comm_timeout_s=3"]
            t0 = time.monotonic()
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env(ranks))
            except subprocess.TimeoutExpired:
                fail(f"a checkpoint corrupted to {name} HDF5, {ranks} rank(s): still running after 60 s")
            took = time.monotonic() - t0
            lines = [ln for ln in gptc_lines(r.stdout + r.stderr) if f"train.init {path}" in ln]
            # an ASan build stops at HDF5's overlapping memcpy, before the fault: its report
            if r.returncode and "ERROR: AddressSanitizer" in r.stderr and "libhdf5" in r.stderr:
                print(f"ok   a checkpoint corrupted to {name} HDF5, {ranks} rank(s): "
                      f"AddressSanitizer caught HDF5's bad copy first")
                continue
            if r.returncode == 0 or not lines or took > 30:
                fail(f"a checkpoint corrupted to {name} HDF5, {ranks} rank(s): exit "
                     f"{r.returncode} after {took:.1f} s, no gptc line naming train.init "
                     f"{path}:\n{(r.stdout + r.stderr)[-1500:]}")
            print(f"ok   a checkpoint corrupted to {name} HDF5, {ranks} rank(s), {took:.1f} s: "
                  f"{lines[0].replace(a + '/', '')}")
    # 28 tensors at 200 ms each: sent once the load says it is in its slowed reads
    p = subprocess.Popen([TRAIN, f"{a}/cfg.ini", f"--train.init={a}/ck.h5"], text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=dict(env(1), GPTC_TEST_SLOW_READS="200"))
    marker = f"test: reading train.init {a}/ck.h5, each read slowed"
    lines, errs = queue.Queue(), []

    def read_stdout():
        for line in p.stdout:
            lines.put(line)
        lines.put(None)
    reader = threading.Thread(target=lambda: errs.extend(p.stderr), daemon=True)
    reader.start()
    threading.Thread(target=read_stdout, daemon=True).start()
    seen, deadline = [], time.monotonic() + 60
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        if line is None:  # ended, or 60 s without the marker: the check below fails
            p.kill()
            break
        seen.append(line)
        if line.startswith(marker):
            # to the main thread, the one reading: a signal to the process may be taken
            # by another, whose crash names no file
            if ctypes.CDLL(None, use_errno=True).tgkill(p.pid, p.pid, 11) != 0:
                p.send_signal(11)
            break
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    reader.join(timeout=10)
    out, err = "".join(seen), "".join(errs)
    want = f"gptc: error: rank 0: a crash (SIGSEGV) while reading train.init {a}/ck.h5: a corrupt file?"
    if p.returncode == 0 or want not in err.splitlines():
        fail(f"SIGSEGV while loading train.init: exit {p.returncode}, want the line {want!r}:\n"
             f"{(out + err)[-1500:]}")
    print(f"ok   a crash while loading train.init names the file; exit {p.returncode}")


def check_singletons_at_once(a):
    """One-rank runs started without a launcher, several at once, as a user's script may
    start them: each runs, or gives its own refusal, alone. Open MPI's isolated singletons
    (what gptc asks for without a launcher) all take one job name, and their session
    directories collided: one's finalize removed the directory another was making, and
    orte_init failed (here 2 or 3 of these 82 runs with the directories on). 8 streams of
    10 refused runs back to back, beside 2 that train."""
    e = env()
    bad = []

    def stream(k, n, args):
        for i in range(n):
            r = subprocess.run([TRAIN, f"{a}/cfg.ini", *args], capture_output=True, text=True,
                               env=e, timeout=120)
            lines = gptc_lines(r.stdout + r.stderr)
            refused = "--train.bogus=1" in args
            if (r.returncode, len(lines)) != ((1, 1) if refused else (0, 0)) or \
                    (refused and "train.bogus" not in lines[0]):
                bad.append(f"stream {k} run {i}: exit {r.returncode}, lines {lines}\n"
                           f"{(r.stdout + r.stderr)[-1200:]}")

    streams = [(k, 10, ["--train.bogus=1"]) for k in range(8)]
    streams += [(k, 1, ["--train.steps=1", f"--train.log_file={D}/at_once{k}.jsonl"])
                for k in (8, 9)]
    threads = [threading.Thread(target=stream, args=x) for x in streams]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if bad:
        fail(f"{len(bad)} of 82 one-rank runs at once failed; the first:\n{bad[0]}")
    print("ok   82 one-rank runs at once without mpirun: 2 trained, 80 refused with their line")


def expect_refused(name, r, want):
    lines = gptc_lines(r.stdout + r.stderr)
    if r.returncode == 0 or len(lines) != 1 or any(w not in lines[0] for w in want) or \
            "step     1" in r.stdout:
        fail(f"{name}: want exit != 0 and one line with {want} before training, got exit "
             f"{r.returncode}, lines {lines}\n{(r.stdout + r.stderr)[-1500:]}")
    print(f"ok   {name}: {lines[0]}")


def read_fifo(fd, out, deadline_s):
    """Reads the FIFO whose read end fd is (opened without waiting for a writer) until the
    writer that came has closed it, the bytes to out; a read that finds no writer before
    any byte came is tried again, until deadline_s. Closes fd."""
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end:
            select.select([fd], [], [], 0.1)
            try:
                b = os.read(fd, 1 << 16)
            except BlockingIOError:  # a writer, no bytes yet
                continue
            if b:
                out.append(b)
            elif out:
                return
            else:
                time.sleep(0.02)
    finally:
        os.close(fd)


def check_report_fifos(a):
    """The trace and the report to FIFOs with readers, on 2 ranks: each reader gets its
    whole JSON, written after the last step through the stream held since the start."""
    fifos = {k: f"{D}/{k}.fifo" for k in ("trace", "report")}
    got = {k: [] for k in fifos}
    readers = []
    for k, path in fifos.items():
        os.mkfifo(path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # open before the run starts
        readers.append(threading.Thread(target=read_fifo, args=(fd, got[k], 100)))
        readers[-1].start()
    r = run_train([f"{a}/cfg.ini", "--parallel.dp=2", "--train.log_file=",
                   "--profile.timing=kernel", f"--profile.trace={fifos['trace']}",
                   f"--profile.report={fifos['report']}"], np_ranks=2, timeout=90)
    for t in readers:
        t.join()
    try:
        trace = json.loads(b"".join(got["trace"]))
        report = json.loads(b"".join(got["report"]))
    except ValueError as e:
        fail(f"trace and report to FIFOs with readers: exit {r.returncode}, not JSON ({e}): "
             f"{[len(b''.join(v)) for v in got.values()]} bytes\n{r.stderr[-800:]}")
    ranks = {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    steps = [s["step"] for s in report["steps"] if s["rank"] == 0]
    if r.returncode or ranks != {0, 1} or steps != [1, 2]:
        fail(f"trace and report to FIFOs with readers: exit {r.returncode}, trace ranks "
             f"{ranks}, report steps {steps}\n{r.stderr[-800:]}")
    print("ok   trace and report to FIFOs with readers: each gets its whole JSON (2 ranks)")


def check_no_effect(a):
    """Settings that do nothing in this run train, with one warning each naming the key:
    save_every without train.save, and NCCL's CTA settings on the CPU."""
    r = run_train([f"{a}/cfg.ini", "--train.save_every=1", "--overlap.comm_max_ctas=8",
                   "--overlap.comm_cta_policy=zero"], timeout=60)
    warns = [x for x in r.stderr.splitlines() if x.startswith("gptc: warning:")]
    want = ["train.save_every = 1", "overlap.comm_max_ctas = 8", "overlap.comm_cta_policy = zero"]
    if r.returncode or len(warns) != 3 or any(w not in x for w, x in zip(want, warns)):
        fail(f"settings with no effect: exit {r.returncode}, warnings {warns}, want {want}")
    print("ok   settings with no effect train, with a warning each: " + "; ".join(warns))


def check_ranks_disagree(a, b):
    expect_refused("rank 1 alone has an unknown key",
                   mpmd([(a, ["--parallel.dp=2"]), (a, ["--parallel.dp=2", "--train.bogus=1"])]),
                   ["rank 1:", "unknown key train.bogus"])
    expect_refused("rank 0 alone has an unknown key",
                   mpmd([(a, ["--parallel.dp=2", "--train.bogus=1"]), (a, ["--parallel.dp=2"])]),
                   ["rank 0:", "unknown key train.bogus"])
    # --help on one rank only: it had printed and left, the other waiting for it
    expect_refused("rank 1 alone asks for --help",
                   mpmd([(a, ["--parallel.dp=2"]), (a, ["--help"])], timeout=60),
                   ["rank 1:", "--help here, but not on rank 0"])
    expect_refused("rank 0 alone asks for --help",
                   mpmd([(a, ["-h"]), (a, ["--parallel.dp=2"])], timeout=60),
                   ["rank 1:", "--help on rank 0, but not here"])
    expect_refused("rank 1 alone has another seed",
                   mpmd([(a, ["--parallel.dp=2"]), (a, ["--parallel.dp=2", "--train.seed=5"])]),
                   ["rank 1:", "train.seed = 5 here", "train.seed = 1337 on rank 0"])
    # the same arguments, but rank 1's directory lacks the checkpoint (a node's own disk)
    expect_refused("a checkpoint rank 1 cannot see",
                   mpmd([(a, ["--parallel.dp=2", "--train.init=ck.h5"]),
                         (b, ["--parallel.dp=2", "--train.init=ck.h5"])]),
                   ["rank 1:", "train.init ck.h5", "does not exist"])
    # each rank sees a checkpoint by that name, but not the same one: a model of other
    # shape (the gradient buffers' sizes differ: an all-reduce past one rank's buffer), or
    # another step (the ranks would run different numbers of steps)
    for name, extra, want in (("of another shape", ["--model.n_layer=4"], "n_layer = 4 here, but 2"),
                              ("of another step", ["--train.steps=1"], "step = 1 here, but 0")):
        # b's cfg.ini sets the model; the other shape is the one the checkpoint holds
        r = run_train([f"{b}/cfg.ini", "--train.steps=0", f"--train.save={b}/ck.h5", *extra])
        if r.returncode:
            fail(f"cannot write rank 1's checkpoint:\n{r.stderr}")
        expect_refused(f"rank 1's checkpoint is {name}",
                       mpmd([(a, ["--parallel.dp=2", "--train.init=ck.h5", "--train.steps=3"]),
                             (b, ["--parallel.dp=2", "--train.init=ck.h5", "--train.steps=3"])]),
                       ["rank 1:", "train.init ck.h5", want, "on rank 0"])
    os.remove(f"{b}/ck.h5")
    # each rank reads tok.h5 from its own directory (a node's own disk): of another length,
    # or as long with other tokens, it is refused (the ranks trained on different data)
    rng = np.random.default_rng(4)
    toks = rng.integers(0, 64, 2000)
    write_tokens(f"{a}/tok.h5", toks, 64)
    other = toks.copy()
    other[1234] = (other[1234] + 1) % 64
    for name, b_toks, want in (("longer", np.concatenate([toks, toks[:10]]),
                                ["tokens = 2010 here, but 2000 on rank 0"]),
                               ("of other tokens", other, ["differ from rank 0's"])):
        write_tokens(f"{b}/tok.h5", b_toks, 64)
        expect_refused(f"rank 1's token file is {name}",
                       mpmd([(a, ["--parallel.dp=2", "--data.path=tok.h5"]),
                             (b, ["--parallel.dp=2", "--data.path=tok.h5"])]),
                       ["rank 1:", "data.path tok.h5", *want])
    write_tokens(f"{b}/tok.h5", toks, 64)
    r = mpmd([(a, ["--parallel.dp=2", "--data.path=tok.h5"]),
              (b, ["--parallel.dp=2", "--data.path=tok.h5"])])
    if r.returncode:
        fail(f"the same tokens in two directories do not train:\n{r.stderr[-1500:]}")
    print("ok   two copies of the same token file train")
    r = mpmd([(a, ["--parallel.dp=2", "--train.init=ck.h5"]),
              (a, ["--parallel.dp=2", "--train.init=ck.h5"])])
    if r.returncode:
        fail(f"the same checkpoint on both ranks does not train:\n{r.stderr[-1500:]}")
    print("ok   both ranks with the same inputs train")


def check_thread_limit(a):
    """One rank that cannot start a thread (ulimit -u: GPTC_TEST_THREAD_FAIL stands in, as
    root ignores the limit) for its watchdog or its communication streams: every rank
    stops at once with that rank's line and the reason. The others waited out
    train.comm_timeout_s (60 s) in their communicator set-up or their first op."""
    import time
    for what, want in (("watchdog", "could not start the watchdog thread"),
                       ("lanes", "could not create the communication streams")):
        t0 = time.time()
        cmd = [*MPIRUN, "-np", "2", "-wdir", a, "-x", f"GPTC_TEST_THREAD_FAIL=1:{what}",
               TRAIN, "cfg.ini", "--parallel.dp=2", "--train.comm_timeout_s=60"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=50, env=env(2))
        except subprocess.TimeoutExpired:
            fail(f"{what} failing on rank 1: the job was still running after 50 s")
        took = time.time() - t0
        expect_refused(f"rank 1 cannot start its {what} ({took:.1f} s)", r,
                       ["rank 1", want, "Resource temporarily unavailable"])


def check_outputs(a):
    os.mkfifo(f"{D}/fifo")
    os.symlink("/nonexistent/r.json", f"{D}/dangling.json")
    os.symlink(f"{D}/loop_b", f"{D}/loop_a")
    os.symlink(f"{D}/loop_a", f"{D}/loop_b")
    kernel = ["--profile.timing=kernel"]
    cases = [
        ("report a dangling link", kernel + [f"--profile.report={D}/dangling.json"],
         ["profile.report", "symbolic link to nowhere"]),
        # root passes access(W_OK) in /proc: only creating a file there tells
        ("save in /proc", ["--train.save=/proc/gptc.h5"], ["train.save", "a /proc file"]),
        ("trace in /proc", kernel + ["--profile.trace=/proc/t.json"],
         ["profile.trace", "cannot create a file"]),
        ("save onto a loop of links", [f"--train.save={D}/loop_a"], ["train.save", "loop of links"]),
        ("save onto a FIFO", [f"--train.save={D}/fifo"], ["train.save", "not a regular file"]),
        ("save onto /dev/null", ["--train.save=/dev/null"], ["train.save", "not a regular file"]),
        # opening a FIFO to read waits for a writer: the loader must not
        ("tokens from a FIFO", [f"--data.path={D}/fifo"], ["data.path", "not a regular file"]),
        # in long: each is within its range, their int product wraps to 0
        ("tp * pp overflows an int", ["--parallel.tp=65536", "--parallel.pp=65536"],
         ["parallel.tp * parallel.pp = 4294967296"]),
    ]
    # an existing file of another kind than the output would overwrite it: a checkpoint
    # given as the metrics file, trace or report, a text file as the checkpoint
    with open(f"{D}/notes.txt", "w") as f:
        f.write("my notes\n")
    cases += [
        ("metrics onto a checkpoint", [f"--train.log_file={a}/ck.h5"],
         ["train.log_file", "ck.h5", "an HDF5 file"]),
        ("trace onto a checkpoint", kernel + [f"--profile.trace={a}/ck.h5"],
         ["profile.trace", "an HDF5 file"]),
        ("report onto a text file", kernel + [f"--profile.report={D}/notes.txt"],
         ["profile.report", "notes.txt", "not JSON"]),
        ("save onto a text file", [f"--train.save={D}/notes.txt"],
         ["train.save", "notes.txt", "not an HDF5 file"]),
        # HDF5 both, but a token file (a validation set, say) is not a checkpoint
        ("save onto a token file", [f"--train.save={D}/val_tok.h5"],
         ["train.save", "val_tok.h5", "a token file (it has /tokens), not a checkpoint"]),
        ("save onto another HDF5 file", [f"--train.save={D}/other.h5"],
         ["train.save", "other.h5", "an HDF5 file that is not a checkpoint"]),
        # JSON both, but a kept report is not a trace: a swapped pair of the two lost it
        ("trace onto a report", kernel + [f"--profile.trace={D}/kept_report.json"],
         ["profile.trace", "kept_report.json", "a timing report, not a trace"]),
        ("report onto a trace", kernel + [f"--profile.report={D}/kept_trace.json"],
         ["profile.report", "kept_trace.json", "a trace, not a timing report"]),
        ("metrics onto a report", [f"--train.log_file={D}/kept_report.json"],
         ["train.log_file", "kept_report.json", "a timing report, not a metrics file"]),
    ]
    with open(f"{D}/kept_report.json", "w") as f:
        f.write('{\n  "ranks": 1,\n  "steps": []\n}\n')
    with open(f"{D}/kept_trace.json", "w") as f:
        f.write('{"traceEvents": [\n], "displayTimeUnit": "ms"}\n')
    write_tokens(f"{D}/val_tok.h5", np.arange(100) % 64, 64)
    import h5py
    with h5py.File(f"{D}/val_tok.h5", "r+") as f:  # another tool's own label: still tokens
        f.attrs["format"] = "tokens-v1"
    with h5py.File(f"{D}/other.h5", "w") as f:
        f["x"] = np.arange(4)
    kept = {p: open(p, "rb").read() for p in (f"{a}/ck.h5", f"{D}/notes.txt",
                                             f"{D}/val_tok.h5", f"{D}/other.h5",
                                             f"{D}/kept_report.json", f"{D}/kept_trace.json")}
    for name, args, want in cases:
        try:
            r = run_train([f"{a}/cfg.ini"] + args, timeout=60)
        except subprocess.TimeoutExpired:
            fail(f"{name}: hang")
        expect_refused(name, r, want)
    # and gptc-data's token file onto a checkpoint
    r = subprocess.run([DATA, "--out", f"{a}/ck.h5", f"{a}/cfg.ini"], capture_output=True,
                       text=True, timeout=60, env=env())
    if r.returncode != 1 or "--out" not in r.stderr or \
            "ck.h5: exists and is a checkpoint, not a token file" not in r.stderr:
        fail(f"gptc-data --out onto a checkpoint: exit {r.returncode}, {r.stderr[-400:]!r}")
    print(f"ok   gptc-data --out onto a checkpoint: {r.stderr.strip()}")
    for p, b in kept.items():
        if open(p, "rb").read() != b:
            fail(f"a refused run changed {p}, which it would have overwritten")
    r = subprocess.run([DATA, "--out", f"{D}/val_tok.h5", f"{a}/cfg.ini"], capture_output=True,
                       text=True, timeout=60, env=env())
    if r.returncode:
        fail(f"gptc-data --out onto a token file (with a format attribute): {r.stderr[-400:]!r}")
    # a FIFO: with no reader it is refused at once (opening it had waited forever); with
    # one, the reader gets the lines
    expect_refused("metrics to a FIFO with no reader", run_train(
        [f"{a}/cfg.ini", f"--train.log_file={D}/fifo"], timeout=60),
        ["train.log_file", "fifo", "no reader"])
    # the trace and report are written after the last step, but a FIFO of theirs with no
    # reader is refused before the first: the run's report is not lost at its end
    for key in ("trace", "report"):
        expect_refused(f"{key} to a FIFO with no reader", run_train(
            [f"{a}/cfg.ini", "--train.log_file=", "--profile.timing=kernel",
             f"--profile.{key}={D}/fifo"], timeout=60),
            [f"profile.{key}", "fifo", "no reader"])
    check_report_fifos(a)
    # the reader's end open before the run (no race with its start); the two lines wait in
    # the FIFO's buffer until read
    fd = os.open(f"{D}/fifo", os.O_RDONLY | os.O_NONBLOCK)
    r = run_train([f"{a}/cfg.ini", f"--train.log_file={D}/fifo"], timeout=60)
    got = os.read(fd, 1 << 16).decode().splitlines()
    os.close(fd)
    if r.returncode or len(got) != 2 or not got[0].startswith('{"step": 1'):
        fail(f"metrics to a FIFO with a reader: exit {r.returncode}, the reader got {got}\n"
             f"{r.stderr[-800:]}")
    print("ok   metrics to a FIFO with a reader: it gets each step's line")
    r = run_train([f"{a}/cfg.ini", "--train.log_file=/dev/null"], timeout=60)
    if r.returncode:
        fail(f"metrics to /dev/null refused:\n{r.stderr[-800:]}")
    print("ok   metrics to /dev/null train")
    # two streams to one device are not one file to overwrite
    r = run_train([f"{a}/cfg.ini", "--train.log_file=/dev/null", "--profile.timing=kernel",
                   "--profile.report=/dev/null", "--profile.trace=/dev/null"], timeout=60)
    if r.returncode:
        fail(f"metrics, report and trace all to /dev/null refused:\n{r.stderr[-800:]}")
    print("ok   metrics, report and trace all to /dev/null train")
    # a log that stops taking lines (a full disk): training goes on, says so at the first
    # line lost, and counts them at the end (all of the 2 steps here)
    r = run_train([f"{a}/cfg.ini", "--train.log_file=/dev/full"], timeout=60)
    # on stderr, beside the errors: a stdout that is gone takes no warning along
    warned = [x for x in r.stderr.splitlines()
              if x.startswith("gptc: warning: train.log_file /dev/full")]
    if r.returncode or len(warned) != 2 or "step 1 could not be written" not in warned[0] or \
            "2 step line(s) could not be written" not in warned[1]:
        fail(f"metrics to /dev/full: exit {r.returncode}, warnings {warned}\n{r.stderr[-800:]}")
    print(f"ok   metrics to /dev/full: {warned[0]}")
    # a trace that cannot be written (streamed rank by rank to its file): every rank exits
    # nonzero, one error names the key and the cause, the report before it is whole
    r = run_train([f"{a}/cfg.ini", "--parallel.dp=2", "--train.log_file=", "--profile.timing=kernel",
                   f"--profile.report={a}/full.report.json", "--profile.trace=/dev/full"],
                  np_ranks=2, timeout=90)
    said = [x for x in r.stderr.splitlines() if x.startswith("gptc: error:")]
    try:
        whole = len(json.load(open(f"{a}/full.report.json"))["steps"]) > 0
    except (OSError, ValueError, KeyError):
        whole = False
    if r.returncode == 0 or len(said) != 1 or "profile.trace /dev/full: write failed: No space" \
            not in said[0] or not whole:
        fail(f"trace to /dev/full: exit {r.returncode}, errors {said}, report whole {whole}\n"
             f"{r.stderr[-800:]}")
    print(f"ok   trace to /dev/full: {said[0]}")
    check_stdout_file(a)


def check_stdout_file(a):
    """An output to /dev/stdout while the shell sends stdout to a file: the file holds the
    run's lines and the output between them, each whole. /dev/stdout opened anew was a
    second open file: the metrics' O_TRUNC cut the lines before it, the report was
    written over from its start by the table printed after it."""
    import json
    for name, extra in (("metrics", ["--train.log_file=/dev/stdout"]),
                        ("report", ["--profile.timing=kernel", "--profile.report=/dev/stdout"])):
        path = f"{D}/{name}.stdout"
        with open(path, "w") as out:
            r = subprocess.run([TRAIN, f"{a}/cfg.ini", *extra], stdout=out,
                               stderr=subprocess.PIPE, text=True, timeout=60, env=env())
        with open(path) as f:
            lines = f.read().splitlines()
        metrics = [json.loads(x) for x in lines if x.startswith('{"step"')]
        said = [x for x in lines if x.startswith("step ") or x.startswith("done:")]
        whole = name == "metrics" and [m["step"] for m in metrics] == [1, 2]
        if name == "report" and "{" in lines and "}" in lines:
            try:
                whole = "kernels" in json.loads("\n".join(lines[lines.index("{"):
                                                                lines.index("}") + 1]))
            except ValueError:
                whole = False
        if r.returncode or not whole or len(said) != 3 or "[train]" not in lines:
            fail(f"{name} to /dev/stdout sent to a file: exit {r.returncode}, the file holds "
                 f"{len(lines)} lines, {len(said)} step and done lines:\n" + "\n".join(lines[:40]))
    print("ok   metrics and report to /dev/stdout sent to a file: the run's lines and the "
          "output, each whole")
    check_replaced_stdout(a)
    check_output_is_stdout(a)
    check_saved_over_link(a)
    check_stdout_closed(a)


def check_output_is_stdout(a):
    """An output named by the file the shell sends stdout (or stderr) to: refused, naming
    the key and the stream. Opened anew, the metrics' O_TRUNC had cut the run's lines to
    NUL bytes and both wrote over each other; a report or checkpoint renamed over the file
    sent the run's later lines to a file no name reaches."""
    cases = [("metrics", [TRAIN, f"{a}/cfg.ini", "--train.log_file={}"], "train.log_file", 1),
             ("report", [TRAIN, f"{a}/cfg.ini", "--profile.timing=kernel",
                         "--profile.report={}"], "profile.report", 1),
             ("checkpoint", [TRAIN, f"{a}/cfg.ini", "--train.save={}"], "train.save", 1),
             ("metrics to stderr's", [TRAIN, f"{a}/cfg.ini", "--train.log_file={}"],
              "train.log_file", 2),
             ("gptc-data --out", [DATA, "--out", "{}", f"{a}/cfg.ini"], "--out", 1)]
    for what, cmd, key, fd in cases:
        path = f"{D}/same.out"
        with open(path, "w") as f:
            r = subprocess.run([x.format(path) for x in cmd], stdout=f if fd == 1 else None,
                               stderr=f if fd == 2 else subprocess.PIPE, text=True,
                               timeout=60, env=env())
        with open(path, "rb") as f:
            text = f.read().decode(errors="replace")
        said = text if fd == 2 else r.stderr
        stream = "stdout" if fd == 1 else "stderr"
        if r.returncode != 1 or f"{key} {path}: is the file this run's {stream} goes to" \
                not in said or "\0" in text:
            fail(f"{what} to the file {stream} goes to: exit {r.returncode}, "
                 f"{said[-400:]!r}")
    # under mpirun a rank's stdout is a pty (stderr a pipe) that mpirun copies to its own:
    # the file is mpirun's, and the metrics opened anew were written over by mpirun's copy
    # of the run's lines (865 NUL bytes and no metrics line, exit 0)
    for fd in (1, 2):
        path = f"{D}/mpirun.out"
        with open(path, "w") as f:
            r = subprocess.run([*MPIRUN, "-np", "2", TRAIN, f"{a}/cfg.ini", "--parallel.dp=2",
                                f"--train.log_file={path}"], stdout=f if fd == 1 else None,
                               stderr=f if fd == 2 else subprocess.PIPE, text=True, timeout=120,
                               env=env(2))
        text = open(path, "rb").read().decode(errors="replace")
        said = text if fd == 2 else r.stderr
        stream = "stdout" if fd == 1 else "stderr"
        if r.returncode == 0 or f"train.log_file {path}: is the file this run's {stream} goes " \
                f"to (through mpirun)" not in said or "\0" in text or '{"step"' in text:
            fail(f"metrics to the file mpirun's {stream} goes to: exit {r.returncode}, "
                 f"{said[-600:]!r}")
    # a run whose stdout is /dev/null, its parent's the file: the run's lines go nowhere,
    # and the metrics are the file's alone (a device forwards nothing to the parent)
    path = f"{D}/parent.out"
    with open(path, "w") as f:
        r = subprocess.run(["sh", "-c", f"'{TRAIN}' '{a}/cfg.ini' --train.log_file='{path}' "
                            "> /dev/null"], stdout=f, stderr=subprocess.PIPE, text=True,
                           timeout=60, env=env())
    steps = [json.loads(x)["step"] for x in open(path)]
    if r.returncode or steps != [1, 2]:
        fail(f"metrics to the parent's stdout file, the run's own to /dev/null: exit "
             f"{r.returncode}, steps {steps}: {r.stderr[-400:]!r}")
    # the user's own link to /dev/stdout is not one of the names output_stream_open writes
    # through the descriptor: opened anew, it was the second open file above
    link, path = f"{D}/to_stdout.jsonl", f"{D}/same.out"
    if os.path.lexists(link):
        os.remove(link)
    os.symlink("/dev/stdout", link)
    for key in ("train.log_file", "train.save"):
        with open(path, "w") as f:
            r = subprocess.run([TRAIN, f"{a}/cfg.ini", f"--{key}={link}"], stdout=f,
                               stderr=subprocess.PIPE, text=True, timeout=60, env=env())
        if r.returncode != 1 or f"{key} {link}: is the file this run's stdout goes to" \
                not in r.stderr or not os.path.islink(link):
            fail(f"{key} a link to /dev/stdout (stdout a file): exit {r.returncode}, "
                 f"{r.stderr[-400:]!r}")
    print("ok   metrics, report, checkpoint and gptc-data --out to the file stdout (stderr) "
          "goes to, also through mpirun, and metrics and checkpoint to a link to /dev/stdout: "
          "refused")


def check_replaced_stdout(a):
    """A checkpoint (train.save) or gptc-data's --out to /dev/stdout, /dev/fd/1 or a /proc
    path, stdout sent to an empty file: refused, and /dev/stdout is still the system's
    link. A file written beside /dev/stdout and renamed over it replaced that link (root
    may write in /dev), not the file behind it, for every later process."""
    link = os.readlink("/dev/stdout") if os.path.islink("/dev/stdout") else None
    for path in ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"):
        for what, cmd, key in (
                ("train.save", [TRAIN, f"{a}/cfg.ini", f"--train.save={path}"], "train.save"),
                ("gptc-data --out", [DATA, "--out", path, f"{a}/cfg.ini"], "--out")):
            out = f"{D}/replaced.stdout"
            with open(out, "w") as f:
                r = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, timeout=60,
                                   env=env())
            broken = link is not None and not os.path.islink("/dev/stdout")
            if broken:  # put the system's link back before saying so
                os.remove("/dev/stdout")
                os.symlink(link, "/dev/stdout")
            if r.returncode != 1 or broken or key not in r.stderr or "descriptor" not in r.stderr:
                fail(f"{what} {path} (stdout a file): exit {r.returncode}, /dev/stdout "
                     f"{'replaced by a file' if broken else 'kept'}: {r.stderr[-400:]!r}")
    print("ok   train.save and gptc-data --out to /dev/stdout, /dev/fd/1 and /proc/self/fd/1 "
          "refused; /dev/stdout kept")


def check_saved_over_link(a):
    """train.save and gptc-data's --out that are symbolic links to a file: the link is
    replaced by the new file, and the file it pointed to (say, a shared pretrained
    checkpoint or token file) is left byte for byte as it was."""
    import hashlib
    digest = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()  # noqa: E731
    for what, target, cmd in (
            ("train.save", f"{a}/ck.h5", [TRAIN, f"{a}/cfg.ini", "--train.steps=1",
                                          "--train.save={}"]),
            ("gptc-data --out", f"{D}/tok.h5", [DATA, "--out", "{}", f"{a}/cfg.ini"])):
        link = f"{D}/link_out.h5"
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(target, link)
        before = digest(target)
        r = subprocess.run([x.format(link) for x in cmd], capture_output=True, text=True,
                           timeout=60, env=env())
        if r.returncode or digest(target) != before or os.path.islink(link) or \
                not os.path.isfile(link) or digest(link) == before:
            fail(f"{what} a link to {target}: exit {r.returncode}, the link "
                 f"{'kept' if os.path.islink(link) else 'replaced'}, the target "
                 f"{'kept' if digest(target) == before else 'changed'}: {r.stderr[-400:]!r}")
        os.remove(link)
    print("ok   train.save and gptc-data --out a link: the link replaced, its target kept")


def check_stdout_closed(a):
    """A run started with stdout closed (1>&-): the first file it opened took descriptor 1,
    so its lines went into that file, and /dev/stdout named it ("Invalid argument" for a
    file open read-only). Now /dev/stdout is refused before training, and a run that
    saves and logs metrics leaves both files whole, the run's lines in neither."""
    import json
    close1 = lambda: os.close(1)  # noqa: E731
    r = subprocess.run([TRAIN, f"{a}/cfg.ini", "--train.log_file=/dev/stdout"],
                       stderr=subprocess.PIPE, text=True, timeout=60, env=env(),
                       preexec_fn=close1)
    lines = [x for x in r.stderr.splitlines() if x.startswith("gptc: error:")]
    if r.returncode == 0 or len(lines) != 1 or "not open" not in lines[0]:
        fail(f"metrics to /dev/stdout with stdout closed: exit {r.returncode}, {lines}")
    print(f"ok   metrics to /dev/stdout with stdout closed: {lines[0]}")
    log, ck = f"{D}/closed.jsonl", f"{D}/closed.h5"
    r = subprocess.run([TRAIN, f"{a}/cfg.ini", f"--train.log_file={log}", f"--train.save={ck}"],
                       stderr=subprocess.PIPE, text=True, timeout=60, env=env(),
                       preexec_fn=close1)
    with open(log) as f:
        text = f.read()
    import h5py
    with h5py.File(ck) as f:
        step = int(f.attrs["step"])
    if r.returncode or "step " in text or "[train]" in text or step != 2 or \
            [json.loads(x)["step"] for x in text.splitlines()] != [1, 2]:
        fail(f"a run with stdout closed: exit {r.returncode}, checkpoint step {step}, the "
             f"metrics file:\n{text[:600]}\n{r.stderr[-600:]}")
    print("ok   a run with stdout closed: the metrics file and the checkpoint are whole")
    # stdin closed: /dev/null stands in, and a config or an input read from it was empty
    close0 = lambda: os.close(0)  # noqa: E731
    for what, cmd in (("gptc-train /dev/stdin", [TRAIN, "/dev/stdin", f"--data.path={D}/tok.h5"]),
                      ("gptc-data -", [DATA, "--out", f"{D}/fromstdin.h5", f"{a}/cfg.ini", "-"])):
        r = subprocess.run(cmd, capture_output=False, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, timeout=60, env=env(),
                           preexec_fn=close0)
        if r.returncode == 0 or "stdin was closed" not in r.stderr:
            fail(f"{what} with stdin closed: exit {r.returncode}, {r.stderr[-400:]!r}")
        print(f"ok   {what} with stdin closed: {r.stderr.strip().splitlines()[-1]}")


def main():
    write_tokens(f"{D}/tok.h5", np.random.default_rng(3).integers(0, 64, 2000), 64)
    a, b = f"{D}/a", f"{D}/b"
    for d in (a, b):
        os.makedirs(d)
        with open(f"{d}/cfg.ini", "w") as f:
            f.write(CFG.format(tok=f"{D}/tok.h5"))
    r = run_train([f"{a}/cfg.ini", "--train.steps=0", f"--train.save={a}/ck.h5"])
    if r.returncode:
        fail(f"cannot write the checkpoint:\n{r.stderr}")
    check_no_effect(a)
    check_singletons_at_once(a)
    check_corrupt_checkpoint(a)
    check_slow_peer(a)
    check_ranks_disagree(a, b)
    check_thread_limit(a)
    check_outputs(a)
    print("PASS: start-up checks refuse what one rank or one path would fail on")


if __name__ == "__main__":
    main()
