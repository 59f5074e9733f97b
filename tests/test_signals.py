"""SIGTERM (as Slurm sends before a time limit) or SIGINT: every rank finishes the step in
flight, a checkpoint of that step is written, all exit 0, and resuming from it gives the
losses of a run of the same layout that never stopped, bit for bit. A reader of stdout
that goes away (| head -1) stops nothing.

The signal goes out once step 3 is logged, and the ranks run on while the test is
scheduled, pgrep runs and the signal lands: on a loaded 2-core machine that took more
than 37 steps of this tiny model (3 ms each). So step 4 waits for the signal, up to a
minute (GPTC_TEST_SLOW_STEP: a rank's wait ends when its stop signal comes; it changes no
number), and the stop lands in step 4 however slow the machine; the runs are 20 steps
long (they were 300, without the wait: most of this test's time under ASan)."""
import os
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import (MPIRUN, TRAIN, env, fail, read_metrics, run_train,  # noqa: E402
                          work_dir, write_tokens)

D = work_dir("gptc_signals_")
STEPS = 20
BASE = ["--model.n_layer=2", "--model.n_head=2", "--model.d_model=64", "--model.n_ctx=32",
        "--model.vocab_size=64", f"--data.path={D}/tok.h5", f"--train.steps={STEPS}",
        "--train.global_batch=8", "--train.seq_len=32", "--train.lr=3e-3",
        "--train.lr_schedule=cosine", "--train.warmup_steps=3"]


def interrupted(name, ranks, sig, extra=(), blocked=False, twice=False):
    """Starts a run, signals every rank once step 3 is logged; returns the metrics.
    blocked: the run starts with sig blocked, as a launcher may pass it on. twice: each rank
    gets the signal twice in a row, as a terminal's Ctrl-C reaches the ranks under mpirun
    and mpirun forwards it: still one graceful stop."""
    log = f"{D}/{name}.jsonl"
    args = BASE + [f"--train.log_file={log}", f"--train.save={D}/{name}.h5", *extra]
    if ranks > 1:
        args.append(f"--parallel.dp={ranks}")
    cmd = ([*MPIRUN, "-np", str(ranks)] if ranks > 1 else []) + [TRAIN, *args]
    block = (lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {sig})) if blocked else None
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(env(ranks), GPTC_TEST_SLOW_STEP="4:60000"), preexec_fn=block)
    deadline = time.time() + 120
    while time.time() < deadline:
        if os.path.exists(log) and len(read_metrics(log, partial_ok=True)) >= 3:
            break
        time.sleep(0.05)
    else:
        p.kill()
        fail(f"{name}: step 3 never logged")
    # the ranks themselves get the signal, as a batch system's step would
    pids = [p.pid] if ranks == 1 else [int(x) for x in subprocess.run(
        ["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()]
    if ranks > 1 and len(pids) != ranks:
        p.kill()
        fail(f"{name}: found {len(pids)} rank processes, expected {ranks}")
    for _ in range(2 if twice else 1):
        for pid in pids:
            os.kill(pid, sig)
    out, err = p.communicate(timeout=120)
    if p.returncode != 0:
        fail(f"{name}: exit {p.returncode} after {signal.Signals(sig).name}\n{err[-2000:]}")
    if "stopped by a signal" not in out:
        fail(f"{name}: no word of the stop on stdout")
    done = read_metrics(log)
    if len(done) >= STEPS:
        fail(f"{name}: ran all {STEPS} steps, the signal came too late to test anything")
    # step 4 waited for the signal: it is the step in flight, finished, and the last
    if done[-1]["step"] != 4:
        fail(f"{name}: the signal came in step 4, the run stopped after step {done[-1]['step']}")
    return done


def check_timed_stop(name, ranks, done):
    """A stopped run still writes its report and trace: a step row per rank for each step
    that ran, and those steps' records."""
    import json
    try:
        rep = json.load(open(f"{D}/{name}.report.json"))
        events = json.load(open(f"{D}/{name}.trace.json"))["traceEvents"]
    except (OSError, ValueError) as e:
        fail(f"{name}: no report or trace after the stop: {e}")
    want = sorted((k, m["step"]) for k in range(ranks) for m in done)
    got = sorted((r["rank"], r["step"]) for r in rep["steps"])
    if got != want:
        fail(f"{name}: the report's steps {got[:4]}... against the {len(done)} steps that ran")
    traced = {e["args"]["step"] for e in events if e.get("ph") == "X"}
    if traced != {m["step"] for m in done}:
        fail(f"{name}: the trace holds steps {sorted(traced)}, {len(done)} ran")
    print(f"ok   {name}: report and trace of the {len(done)} steps before the stop")


def check_reader_gone():
    """stdout piped into a reader that leaves after one line (| head -1): SIGPIPE ends no
    run; every step is logged and the checkpoint written."""
    log, ck = f"{D}/pipe.jsonl", f"{D}/pipe.h5"
    steps = 20
    args = [a for a in BASE if not a.startswith("--train.steps=")]
    p = subprocess.Popen([TRAIN, *args, f"--train.steps={steps}", f"--train.log_file={log}",
                          f"--train.save={ck}"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env(1))
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    rc = p.wait(timeout=120)
    if rc != 0:
        fail(f"reader gone: exit {rc} ({'SIGPIPE' if rc == -signal.SIGPIPE else 'error'})\n"
             f"{err[-1500:]}")
    if len(read_metrics(log)) != steps or not os.path.exists(ck):
        fail(f"reader gone: {len(read_metrics(log))} of {steps} steps logged, checkpoint "
             f"{'written' if os.path.exists(ck) else 'missing'}")
    print(f"ok   reader of stdout gone after one line: all {steps} steps ran, checkpoint written")


def catches_sigterm(pid):
    """1 when process pid has a handler of its own for SIGTERM (/proc's SigCgt mask)"""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(x.split()[1], 16) for x in f if x.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return 0
    return caught >> (signal.SIGTERM - 1) & 1


def check_stop_in_start():
    """A signal in the start-up stops every rank before the first step: exit 0, one line,
    no step run. Here rank 1 waits to read its config from a FIFO (as a rank may wait on a
    slow file system, or load a large train.init, for seconds); SIGTERM then killed it
    outright (exit 143), and mpirun the others."""
    fifos = [f"{D}/start{k}.ini" for k in (0, 1)]
    for f in fifos:
        os.mkfifo(f)
    log = f"{D}/start.jsonl"
    args = BASE + ["--parallel.dp=2", f"--train.log_file={log}"]
    cmd = [*MPIRUN, "-np", "1", TRAIN, fifos[0], *args, ":", "-np", "1", TRAIN, fifos[1], *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env(2))
    rank1, deadline = None, time.time() + 60
    while rank1 is None and time.time() < deadline and p.poll() is None:
        for pid in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                                  text=True).stdout.split():
            # gptc-train's own: a child of mpirun between fork and exec has mpirun's
            # command line (both FIFOs) and handler of SIGTERM
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    mine = fifos[1].encode() in f.read().split(b"\0")
                mine = mine and os.readlink(f"/proc/{pid}/exe") == os.path.realpath(TRAIN)
            except OSError:
                continue
            if mine and catches_sigterm(pid):
                rank1 = int(pid)
        time.sleep(0.02)
    if rank1 is None:
        p.kill()
        fail("stop in start-up: rank 1 never set its SIGTERM handler")
    os.kill(rank1, signal.SIGTERM)
    for f in fifos:  # only now the configs: the ranks read them and go on to step 1
        with open(f, "w") as w:
            w.write("[train]\nsteps = 5\n")
    out, err = p.communicate(timeout=120)
    steps = read_metrics(log) if os.path.exists(log) else []
    if p.returncode != 0 or "stopped by a signal before step 1" not in out or steps:
        fail(f"stop in start-up: exit {p.returncode}, {len(steps)} steps logged (want 0, "
             f"exit 0 and the stop said):\n{out[-800:]}\n{err[-1500:]}")
    print("ok   SIGTERM to rank 1 in its start-up: every rank stopped before step 1, exit 0")


def check_stuck_start():
    """One stop signal, as `timeout` or a batch system sends, to a rank stuck in its start-up
    (its config from a FIFO no one writes): the rank never reached the point where it looks
    at the flag, and outlived the signal. Now it ends by the signal when its start-up has not
    ended within the grace (20 s; GPTC_TEST_STOP_GRACE_S=2 here)."""
    fifo = f"{D}/stuck.ini"
    os.mkfifo(fifo)
    p = subprocess.Popen([TRAIN, fifo], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=dict(env(1), GPTC_TEST_STOP_GRACE_S="2"))
    deadline = time.time() + 60
    while not catches_sigterm(p.pid) and time.time() < deadline and p.poll() is None:
        time.sleep(0.02)
    t0 = time.time()
    p.send_signal(signal.SIGTERM)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        fail("stuck start-up: one SIGTERM did not end a rank blocked reading its config")
    took = time.time() - t0
    if p.returncode != -signal.SIGTERM or "in the start-up" not in err or took < 1.5:
        fail(f"stuck start-up: exit {p.returncode} after {took:.1f} s, stderr {err[-400:]!r}")
    print(f"ok   one SIGTERM to a rank stuck in its start-up ends it after the grace ({took:.1f} s)")


def check_nohup():
    """Under nohup (SIGHUP inherited ignored) a hangup goes unnoticed: every step runs."""
    log = f"{D}/nohup.jsonl"
    steps = 30
    args = [a for a in BASE if not a.startswith("--train.steps=")]
    ignore = lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)  # noqa: E731
    p = subprocess.Popen([TRAIN, *args, f"--train.steps={steps}", f"--train.log_file={log}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(1),
                         preexec_fn=ignore)
    deadline = time.time() + 60
    while time.time() < deadline and not (os.path.exists(log) and read_metrics(log, partial_ok=True)):
        time.sleep(0.02)
    p.send_signal(signal.SIGHUP)
    out, err = p.communicate(timeout=120)
    n = len(read_metrics(log))
    if p.returncode != 0 or n != steps or "stopped by a signal" in out:
        fail(f"nohup: exit {p.returncode}, {n} of {steps} steps, after a SIGHUP it ignores\n"
             f"{err[-800:]}")
    print(f"ok   SIGHUP inherited ignored (nohup): all {steps} steps ran")


def check_forced_stop():
    """A rank blocked where the stop flag is not looked at (its config read from a FIFO no
    one writes, as from a terminal) ignored every SIGTERM: a second one 3 s or more after
    the first ends it by the signal, with a line saying so."""
    fifo = f"{D}/never.ini"
    os.mkfifo(fifo)
    p = subprocess.Popen([TRAIN, fifo], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env(1))
    deadline = time.time() + 60
    while not catches_sigterm(p.pid) and time.time() < deadline and p.poll() is None:
        time.sleep(0.02)
    p.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    if p.poll() is not None:
        fail(f"forced stop: the first SIGTERM ended the run (exit {p.returncode}): it should "
             f"wait for its step")
    time.sleep(3.2)
    p.send_signal(signal.SIGTERM)
    try:
        out, err = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        fail("forced stop: a second SIGTERM 3.7 s after the first did not end a rank blocked "
             "reading its config")
    if p.returncode != -signal.SIGTERM or "a second stop signal" not in err:
        fail(f"forced stop: exit {p.returncode}, stderr {err[-500:]!r}")
    print("ok   a rank blocked in its start-up: the first SIGTERM waits, a second 3.7 s later "
          "ends it")


def main():
    write_tokens(f"{D}/tok.h5", np.random.default_rng(2).integers(0, 64, 20000), 64)
    full = {}
    for ranks in (1, 2):
        # the reference of each layout: dp2 sums gradients in another order than one rank
        extra = [f"--parallel.dp={ranks}"] if ranks > 1 else []
        r = run_train(BASE + extra + [f"--train.log_file={D}/full{ranks}.jsonl"],
                      np_ranks=ranks if ranks > 1 else None)
        if r.returncode:
            fail(f"uninterrupted run on {ranks} rank(s) failed: " + r.stderr[-2000:])
        full[ranks] = read_metrics(f"{D}/full{ranks}.jsonl")
    # usr1: Slurm's --signal=USR1@60 ahead of a time limit; hup2: a closed terminal
    for name, ranks, sig in (("term1", 1, signal.SIGTERM), ("int2", 2, signal.SIGINT),
                             ("term2", 2, signal.SIGTERM), ("usr1", 1, signal.SIGUSR1),
                             ("hup2", 2, signal.SIGHUP)):
        # int2 as a Ctrl-C under mpirun: each rank gets it twice
        # term2 with kernel timing: its report and trace must cover the steps that ran
        timed = ["--profile.timing=kernel", f"--profile.report={D}/{name}.report.json",
                 f"--profile.trace={D}/{name}.trace.json"] if name == "term2" else []
        done = interrupted(name, ranks, sig, timed, twice=name == "int2")
        if timed:
            check_timed_stop(name, ranks, done)
        k = done[-1]["step"]
        extra = [f"--parallel.dp={ranks}"] if ranks > 1 else []
        r = run_train(BASE + extra + [f"--train.init={D}/{name}.h5",
                                      f"--train.log_file={D}/{name}-b.jsonl"],
                      np_ranks=ranks if ranks > 1 else None)
        if r.returncode:
            fail(f"{name}: resume failed: {r.stderr[-2000:]}")
        rest = read_metrics(f"{D}/{name}-b.jsonl")
        if [m["step"] for m in rest] != list(range(k + 1, STEPS + 1)):
            fail(f"{name}: resumed steps {[m['step'] for m in rest][:3]}... after a stop at {k}")
        for a, b in zip(full[ranks], done + rest):
            if (a["loss"], a["grad_norm"]) != (b["loss"], b["grad_norm"]):
                fail(f"{name}: step {a['step']} differs from the uninterrupted run: loss "
                     f"{b['loss']!r} against {a['loss']!r}, grad_norm {b['grad_norm']!r} "
                     f"against {a['grad_norm']!r}")
        print(f"ok   {name}: {signal.Signals(sig).name} to {ranks} rank(s) stopped after step {k}, "
              f"checkpoint written, resume matches the uninterrupted run")
    check_reader_gone()
    check_stop_in_start()
    check_forced_stop()
    check_stuck_start()
    check_nohup()
    # SIGTERM blocked by the launcher: it stayed pending, and the run went on to its end
    done = interrupted("blocked1", 1, signal.SIGTERM, blocked=True)
    print(f"ok   SIGTERM, blocked when the run started, stopped it after step {done[-1]['step']}")
    print("PASS: signals stop cleanly and resume exactly")


if __name__ == "__main__":
    main()
