"""A rank that dies (SIGKILL) or hangs (SIGSTOP) mid-run: the job ends, nonzero, within
train.comm_timeout_s plus a margin, and a surviving rank says which rank it is, that a peer
died or hung, and what it was waiting in. Argument: the device (cpu, or cuda: the ranks
then share a GPU over NCCL or host-staged MPI, and the watchdog also aborts NCCL's
communicators); cuda exits 77 (skipped) without a GPU.

    test_dead_rank.py emu-nccl GPTC_TRAIN_EMU_NCCL

runs the same on the CPU emulator with parallel/comm_nccl.c on the fake NCCL
(tests/cuda_emu/fake_nccl.c; NCCL_MULTI_RANK_GPU_ENABLE=1 lets the comm layer pick it for
two ranks on the one fake GPU): after SIGSTOP the watchdog must also have aborted the
communicators (comm_abort_all -> ncclCommAbort, which makes an op in flight return), and a
third run injects a lost peer connection on rank 1 (GPTC_FAKE_NCCL_FAIL): its watchdog
must see the asynchronous error (comm_poll_async_errors -> ncclCommGetAsyncError) and
abort the job well before the timeout.

Without the fake NCCL, a third run makes one MPI op of rank 1 fail (GPTC_TEST_COMM_FAIL_OP,
parallel/comm.c): the job must end at once with rank 1's line naming the op; and on the CPU
a fourth stops rank 1 in step 5 outside any communication, its watchdog thread running (a
library call that spins, GPTC_TEST_STUCK_STEP): rank 1 must name itself as stuck, first,
and rank 0, if it speaks, blame a peer."""
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import (MPIRUN, TRAIN, env, fail, gpu_present, read_metrics,  # noqa: E402
                          work_dir, write_tokens)

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cpu"
EMU_NCCL = DEVICE == "emu-nccl"
if EMU_NCCL:
    TRAIN, DEVICE = sys.argv[2], "cuda"
    EXTRA_ENV = {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}
else:
    EXTRA_ENV = {}

D = work_dir("gptc_dead_")
# the emulated GPU's steps take seconds each on a loaded 2-core machine (8 s a step was
# seen with other tests beside it): at 4 s its watchdog fired before step 3
TIMEOUT = 8 if EMU_NCCL else 4


def world_rank(pid):
    """The MPI rank of a rank process (Open MPI's environment), or its pid where that is not
    readable (pids rise in launch order but for a wrap-around)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for var in f.read().split(b"\0"):
                if var.startswith(b"OMPI_COMM_WORLD_RANK="):
                    return int(var.split(b"=", 1)[1])
    except (OSError, ValueError):
        pass
    return pid


def run(name, sig, extra_env=None, timeout=TIMEOUT):
    """Starts 2 ranks with train.comm_timeout_s = timeout; once 3 steps are logged, sends
    sig to the second (None: sends nothing, waits for the job to end by itself). Returns
    the seconds from the signal (or from step 3) to the end, and stderr."""
    log = f"{D}/{name}.jsonl"
    args = ["--model.n_layer=2", "--model.n_head=2", "--model.d_model=64", "--model.n_ctx=32",
            "--model.vocab_size=64", f"--data.path={D}/tok.h5", "--train.steps=100000",
            "--train.global_batch=8", "--train.seq_len=32", "--parallel.tp=2",
            f"--train.comm_timeout_s={timeout}", f"--train.log_file={log}",
            f"--train.device={DEVICE}"]
    e = env(2)
    e.update(EXTRA_ENV)
    e.update(extra_env or {})
    p = subprocess.Popen([*MPIRUN, "-np", "2", TRAIN, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=e)
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None and \
            not (os.path.exists(log) and len(read_metrics(log, partial_ok=True)) >= 3):
        time.sleep(0.05)
    ranks = [int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                                            text=True).stdout.split()]
    if sig is None:
        ranks = ranks if len(ranks) == 2 else [0, 0]  # it may have ended already
    if len(ranks) != 2:
        p.kill()
        fail(f"{name}: expected 2 rank processes, found {ranks}")
    victim = max(ranks, key=world_rank)  # rank 1: rank 0 is the one that reports
    t0 = time.time()
    if sig is not None:
        os.kill(victim, sig)
    try:
        out, err = p.communicate(timeout=timeout + 40)
    except subprocess.TimeoutExpired:
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.kill()
        fail(f"{name}: the job still ran {timeout + 40} s after a rank was stopped")
    took = time.time() - t0
    for pid in ranks:  # a stopped rank may outlive mpirun's abort
        if not pid:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if p.returncode == 0:
        fail(f"{name}: exit code 0 after a rank was lost")
    if EMU_NCCL and "communication: nccl" not in out:
        fail(f"{name}: the comm layer did not pick the fake NCCL:\n{out[-2000:]}")
    return took, err


def aborts(name, err):
    """The fake's lines from ncclCommAbort (one per communicator the watchdog aborted);
    fails unless there are some and every op in flight returned."""
    lines = [ln for ln in err.splitlines() if "ncclCommAbort of communicator" in ln]
    if not lines or any("still running" in ln for ln in lines):
        fail(f"{name}: the watchdog's comm_abort_all did not abort the communicators, or an op "
             f"in flight did not return:\n{err[-3000:]}")
    return lines


def main():
    if DEVICE == "cuda" and not EMU_NCCL and not gpu_present():
        print("skipped: no GPU visible")
        sys.exit(77)
    write_tokens(f"{D}/tok.h5", np.random.default_rng(8).integers(0, 64, 20000), 64)
    took, err = run("kill", signal.SIGKILL)
    if took > TIMEOUT + 20:
        fail(f"SIGKILL: took {took:.1f} s with train.comm_timeout_s = {TIMEOUT}")
    print(f"ok   SIGKILL of one rank: the job ended nonzero after {took:.1f} s")
    took, err = run("stop", signal.SIGSTOP)
    # rank 0 notices (rank 1 is the one stopped) and, on the CPU, says which collective it
    # waits in (a TP op, or the step's agreement over the world): the MPI op runs on a
    # host thread (NCCL's are enqueued on the device)
    lines = [ln for ln in err.splitlines() if "no progress" in ln]
    if not lines or not lines[0].startswith("gptc: error: rank 0: no progress for ") or \
            "a peer rank has died or hung" not in lines[0] or \
            (DEVICE == "cpu" and not re.search(r", waiting in \w+ on (tp|world): ", lines[0])):
        fail(f"SIGSTOP: no watchdog line from rank 0 naming itself"
             f"{' and the op it waits in' if DEVICE == 'cpu' else ''}:\n{err[-2000:]}")
    if took > TIMEOUT + 20:
        fail(f"SIGSTOP: took {took:.1f} s with train.comm_timeout_s = {TIMEOUT}")
    print(f"ok   SIGSTOP of one rank: aborted after {took:.1f} s: {lines[0]}")
    if not EMU_NCCL:
        # a failed MPI op on rank 1 (GPTC_TEST_COMM_FAIL_OP: its 60th op made a real
        # MPI_ERR_COUNT): skipped, it would leave rank 0 waiting until the timeout, or pair
        # rank 0's op with rank 1's next one; the job ends at once, naming rank 1 and the op.
        # The timeout is far (30 s) and the end wanted well before it: at 4 s, mpirun's kill
        # sequence on a loaded machine could come close to it, and the watchdog fire
        took, err = run("failed-op", None, {"GPTC_TEST_COMM_FAIL_OP": "1:60"}, timeout=30)
        lines = [ln for ln in err.splitlines() if "gptc: error" in ln]
        if not lines or not lines[0].startswith("gptc: error: rank 1: allreduce on tp: ") or \
                "aborting the job" not in lines[0] or "no progress" in err:
            fail(f"failed op: no line from rank 1 naming the op, or the timeout fired:\n{err[-3000:]}")
        if took > 15:
            fail(f"failed op: the job took {took:.1f} s to end (the timeout 30 s did not fire)")
        print(f"ok   a failed MPI op on rank 1 ended the job in {took:.1f} s: {lines[0]}")
    if DEVICE == "cpu":
        # rank 0 waits for rank 1 and gives it a quarter of the timeout (2 s at 8) to speak
        # first: rank 1 stopped beating before rank 0 did
        took, err = run("stuck", None, {"GPTC_TEST_STUCK_STEP": "1:5"}, timeout=8)
        lines = [ln for ln in err.splitlines() if "no progress" in ln]
        if not lines or not lines[0].startswith("gptc: error: rank 1: no progress for ") or \
                "in step 5, waiting for no peer: this rank itself is stuck" not in lines[0] or \
                any("rank 0" in ln and "a peer rank has died or hung" not in ln for ln in lines):
            fail(f"stuck: rank 1 did not name itself first, or rank 0 did not blame a peer:\n"
                 f"{err[-3000:]}")
        if took > 8 + 20:
            fail(f"stuck: took {took:.1f} s with train.comm_timeout_s = 8")
        print(f"ok   rank 1 stuck outside communication named itself after {took:.1f} s: "
              f"{lines[0]}")
    if EMU_NCCL:
        ab = aborts("SIGSTOP", err)
        print(f"ok   SIGSTOP: the watchdog aborted {len(ab)} communicator(s); ops in flight: "
              f"{sum(int(ln.split(' op(s)')[0].split()[-1]) for ln in ab)}, all returned")
        # an injected lost connection: the poll path, long before the timeout
        took, err = run("inject", None, {"GPTC_FAKE_NCCL_FAIL": "1:60"})
        lines = [ln for ln in err.splitlines() if "aborting the job" in ln]
        if not lines or "rank 1: NCCL on " not in lines[0] or \
                "remote process exited or there was a network error" not in lines[0]:
            fail(f"injected: no watchdog message from rank 1 with NCCL's remote error:\n{err[-3000:]}")
        if any("no progress" in ln for ln in lines):
            fail(f"injected: the timeout fired, not the asynchronous error:\n{err[-3000:]}")
        ab = [ln for ln in aborts("injected", err) if "rank 1:" in ln]
        if not any("1 op(s) in flight, all returned" in ln for ln in ab):
            fail(f"injected: rank 1's hung op did not return on ncclCommAbort:\n{err[-3000:]}")
        print(f"ok   injected remote error on rank 1: aborted through its asynchronous error: "
              f"{lines[0]}")
    print("PASS: a lost rank ends the job")


if __name__ == "__main__":
    main()
