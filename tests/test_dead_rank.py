"""A rank that dies (SIGKILL) or hangs (SIGSTOP) mid-run: the job ends, nonzero, within
train.comm_timeout_s plus a margin, and a surviving rank says which rank it is, that a peer
died or hung, and what it was waiting in. Argument: the device (cpu, or cuda: the ranks
then share a GPU over NCCL or host-staged MPI, and the watchdog also aborts NCCL's
communicators); cuda exits 77 (skipped) without a GPU."""
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import MPIRUN, TRAIN, env, fail, gpu_present, read_metrics, write_tokens  # noqa: E402

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cpu"

D = tempfile.mkdtemp(prefix="gptc_dead_")
TIMEOUT = 4


def run(name, sig):
    log = f"{D}/{name}.jsonl"
    args = ["--model.n_layer=2", "--model.n_head=2", "--model.d_model=64", "--model.n_ctx=32",
            "--model.vocab_size=64", f"--data.path={D}/tok.h5", "--train.steps=100000",
            "--train.global_batch=8", "--train.seq_len=32", "--parallel.tp=2",
            f"--train.comm_timeout_s={TIMEOUT}", f"--train.log_file={log}",
            f"--train.device={DEVICE}"]
    p = subprocess.Popen([*MPIRUN, "-np", "2", TRAIN, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env(2))
    deadline = time.time() + 60
    while time.time() < deadline and not (os.path.exists(log) and len(read_metrics(log)) >= 3):
        time.sleep(0.05)
    ranks = [int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                                            text=True).stdout.split()]
    if len(ranks) != 2:
        p.kill()
        fail(f"{name}: expected 2 rank processes, found {ranks}")
    victim = max(ranks)  # the second one launched
    t0 = time.time()
    os.kill(victim, sig)
    try:
        out, err = p.communicate(timeout=TIMEOUT + 40)
    except subprocess.TimeoutExpired:
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.kill()
        fail(f"{name}: the job still ran {TIMEOUT + 40} s after a rank was stopped")
    took = time.time() - t0
    for pid in ranks:  # a stopped rank may outlive mpirun's abort
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if p.returncode == 0:
        fail(f"{name}: exit code 0 after a rank was lost")
    return took, err


def main():
    if DEVICE == "cuda" and not gpu_present():
        print("skipped: no GPU visible")
        sys.exit(77)
    write_tokens(f"{D}/tok.h5", np.random.default_rng(8).integers(0, 64, 20000), 64)
    took, err = run("kill", signal.SIGKILL)
    print(f"ok   SIGKILL of one rank: the job ended nonzero after {took:.1f} s")
    took, err = run("stop", signal.SIGSTOP)
    lines = [ln for ln in err.splitlines() if "no progress" in ln]
    if not lines or "peer rank has died or hung" not in lines[0] or "rank " not in lines[0]:
        fail(f"SIGSTOP: no watchdog message naming the rank:\n{err[-2000:]}")
    if took > TIMEOUT + 20:
        fail(f"SIGSTOP: took {took:.1f} s with train.comm_timeout_s = {TIMEOUT}")
    print(f"ok   SIGSTOP of one rank: aborted after {took:.1f} s: {lines[0]}")
    print("PASS: a lost rank ends the job")


if __name__ == "__main__":
    main()
