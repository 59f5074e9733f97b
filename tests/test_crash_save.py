"""Crash-safe checkpoints: kill -9 a trainer that saves after every step, at random
moments, many times; whatever is at train.save always loads and training resumes from it."""
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import TRAIN, env, fail, run_train, write_tokens  # noqa: E402

D = tempfile.mkdtemp(prefix="gptc_crash_")
# big enough that a save (model + two moments, ~50 MB) takes a good part of each step
MODEL = ["--model.n_layer=4", "--model.n_head=4", "--model.d_model=256", "--model.n_ctx=32",
         "--model.vocab_size=4096", f"--data.path={D}/tok.h5", "--train.global_batch=2",
         "--train.seq_len=32"]


def main():
    write_tokens(f"{D}/tok.h5", np.random.default_rng(6).integers(0, 4096, 20000), 4096)
    ckpt = f"{D}/ckpt.h5"
    rnd = random.Random(11)
    steps_seen = set()
    # Kill times scale with how long this machine takes to start and write the first
    # checkpoint (a sanitizer build on a loaded 2-core machine is many times slower than
    # a release build): the first attempt measures it, the others kill at a random moment
    # between that and three times that.
    first_save = None
    for attempt in range(8):
        p = subprocess.Popen([TRAIN, *MODEL, "--train.steps=1000", "--train.save_every=1",
                              f"--train.save={ckpt}"] + ([f"--train.init={ckpt}"] if os.path.exists(ckpt) else []),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env())
        if first_save is None:
            t0 = time.time()
            while not os.path.exists(ckpt) and p.poll() is None and time.time() - t0 < 300:
                time.sleep(0.02)
            first_save = time.time() - t0
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
        steps_seen.add(step)
        r = run_train(MODEL + [f"--train.init={ckpt}", f"--train.steps={step + 1}"])
        if r.returncode:
            fail(f"attempt {attempt}: the checkpoint left by kill -9 does not resume:\n{r.stderr[-1500:]}")
    if len(steps_seen) < 3:
        fail(f"too few kills landed after a save to test anything: {sorted(steps_seen)}")
    # the partial copies the kills left are removed by the next run that saves there
    r = run_train(MODEL + [f"--train.init={ckpt}", f"--train.steps={max(steps_seen) + 1}",
                           f"--train.save={ckpt}"])
    left = [x for x in os.listdir(D) if ".tmp." in x]
    if r.returncode or left:
        fail(f"stale temporary files after a clean save: {left}\n{r.stderr[-800:]}")
    print(f"ok   8 kills at random moments; the checkpoint always loaded and resumed "
          f"(steps {sorted(steps_seen)}; first save after {first_save:.1f} s)")
    print("PASS: checkpoints survive kill -9")


if __name__ == "__main__":
    main()
