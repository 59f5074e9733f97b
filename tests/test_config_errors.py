"""Bad input is refused before training with one line naming the key (or file), and a
nonzero exit on every rank. Each case lists the arguments and words the message needs."""
import concurrent.futures
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import (MPIRUN, TRAIN, env, fail, gpu_present, run_train, work_dir,  # noqa: E402
                          write_tokens)

D = work_dir("gptc_cfg_")
MODEL = ["--model.n_layer=2", "--model.n_head=2", "--model.d_model=32", "--model.n_ctx=16",
         "--model.vocab_size=50"]
BASE = MODEL + [f"--data.path={D}/tok.h5", "--train.steps=2", "--train.global_batch=4",
                "--train.seq_len=16"]

CASES = [
    # (name, extra args, words that must appear in the error line)
    ("unknown key", ["--train.stpes=3"], ["train.stpes", "unknown key"]),
    ("unknown section", ["--trian.steps=3"], ["[trian]", "unknown section"]),
    ("not a number", ["--train.lr=fast"], ["train.lr", "not a number"]),
    ("infinite number", ["--train.lr=1e309"], ["train.lr", "not a finite number"]),
    ("nan", ["--train.grad_clip=nan"], ["train.grad_clip", "not a finite number"]),
    ("not an integer", ["--train.global_batch=2.5"], ["train.global_batch", "not an integer"]),
    ("out of range", ["--train.beta2=1.5"], ["train.beta2", "out of range"]),
    # the bound as it is: %g printed it as 1, the value refused
    ("beta1 of 1", ["--train.beta1=1"], ["train.beta1", "out of range [0, 0.999999999]"]),
    # one notation for every number: strtod alone would take 0x10 for 16, strtoull(.., 0)
    # 010 for 8
    ("hex integer", ["--train.steps=0x10"], ["train.steps", "not a decimal number"]),
    ("hex float", ["--train.lr=0x1p-10"], ["train.lr", "not a decimal number"]),
    ("hex seed", ["--train.seed=0x10"], ["train.seed", "not a non-negative integer"]),
    ("bad choice", ["--parallel.schedule=zigzag"], ["parallel.schedule", "zigzag"]),
    ("bad boolean", ["--data.shuffle=maybe"], ["data.shuffle", "boolean", "yes|no"]),
    # AdamW divides by sqrt(v) + eps: 0 gives 0/0 where a gradient stays 0 (padded rows)
    ("eps of 0", ["--train.eps=0"], ["train.eps", "out of range"]),
    # the error and the effective config are one line a value
    ("newline in a value", ["--train.save=a\nb.h5"], ["train.save", "control character"]),
    ("malformed argument", ["train.steps=3"], ["train.steps=3", "--section.key=value"]),
    ("seq_len > n_ctx", ["--train.seq_len=32"], ["train.seq_len", "model.n_ctx"]),
    ("batch does not divide", ["--train.micro_batch=3"], ["train.global_batch", "train.micro_batch"]),
    ("heads do not divide", ["--model.n_head=3"], ["model.d_model", "model.n_head"]),
    ("missing model key", ["--model.n_layer=0"], ["model.n_layer", "required"]),
    ("min_lr > lr", ["--train.lr=1e-4", "--train.min_lr=1e-3"], ["train.min_lr"]),
    ("world size", ["--parallel.tp=2"], ["world size 1", "parallel.tp"]),
    ("missing data file", [f"--data.path={D}/nope.h5"], ["data.path", "nope.h5"]),
    ("data not hdf5", [f"--data.path={D}/garbage.h5"], ["data.path", "garbage.h5"]),
    ("token >= vocab", [f"--data.path={D}/big.h5"], ["data.path", "big.h5"]),
    ("missing checkpoint", [f"--train.init={D}/none.h5"], ["none.h5"]),
    ("model contradicts checkpoint", [f"--train.init={D}/ck.h5", "--model.n_layer=3"],
     ["model.n_layer", "ck.h5"]),
    ("save dir missing", [f"--train.save={D}/no/such/dir/ck.h5"], ["train.save", "no/such/dir"]),
    # written after the last step, so checked before the first
    ("trace dir missing", ["--profile.timing=kernel", f"--profile.trace={D}/no/such/dir/t.json"],
     ["profile.trace", "no/such/dir"]),
    ("report dir missing", ["--profile.timing=kernel", f"--profile.report={D}/no/such/dir/r.json"],
     ["profile.report", "no/such/dir"]),
    ("power on the cpu", ["--profile.power=true"], ["profile.power", "train.device = cuda"]),
    ("probe without kernel timing", ["--profile.contention_probe=2"],
     ["profile.contention_probe", "profile.timing = kernel"]),
    ("warm-up without kernel timing", ["--profile.warmup=1"],
     ["profile.warmup", "profile.timing = kernel"]),
    ("negative warm-up", ["--profile.timing=kernel", "--profile.warmup=-1"], ["profile.warmup"]),
    ("bf16 on cuda with a head size of 20", ["--train.device=cuda", "--train.precision=bf16",
                                             "--model.d_model=40"],
     ["train.precision = bf16", "head size", "multiple of 8", "not 20"]),
    ("cuda with a head size of 256", ["--train.device=cuda", "--model.d_model=512"],
     ["train.device = cuda", "head size", "at most 128", "not 256"]),
    # 65536 tiles of 64 rows would pass grid y's limit of 65535 in the attention launches
    ("cuda with seq_len past the attention grid", ["--train.device=cuda",
                                                   "--model.n_ctx=4194305", "--train.seq_len=4194305"],
     ["train.device = cuda", "train.seq_len", "up to 4194240", "not 4194305"]),
    ("unknown policy", ["--overlap.dp=eager"], ["overlap.dp", "eager"]),
    # strtoull skips the blank and wraps -1 to 2^64 - 1
    ("seed with a blank before -", ["--train.seed= -1"], ["train.seed", "not a non-negative integer"]),
    # the watchdog would fire on healthy multi-rank jobs
    ("comm_timeout_s under a second", ["--train.comm_timeout_s=0.5"],
     ["train.comm_timeout_s", "out of range"]),
    ("data without /tokens", [f"--data.path={D}/notokens.h5"], ["data.path", "notokens.h5", "tokens"]),
    ("tokens never written", [f"--data.path={D}/unwritten.h5"], ["data.path", "unwritten.h5", "never written"]),
    # the chunks past the first were never written: they read as zeros
    ("tokens written in part", [f"--data.path={D}/parttok.h5"],
     ["data.path", "parttok.h5", "written only in part", "4 of its 5 chunks"]),
    ("tokens compressed with h5py's lzf", [f"--data.path={D}/lzftok.h5"],
     ["data.path", "lzftok.h5", "filter lzf", "cannot decode"]),
    ("checkpoint tensor compressed with h5py's lzf", [f"--train.init={D}/lzf.h5"],
     ["train.init", "lzf.h5", "/model/ln_f.bias", "filter lzf"]),
    ("data shorter than a window", [f"--data.path={D}/short.h5"], ["data.path", "short.h5", "window"]),
    ("token >= vocab at a position", [f"--data.path={D}/badtok.h5"], ["data.path", "badtok.h5", "position 7"]),
    ("checkpoint not HDF5", [f"--train.init={D}/garbage.h5"], ["train.init", "garbage.h5"]),
    ("checkpoint truncated", [f"--train.init={D}/truncated.h5"], ["train.init", "truncated.h5"]),
    ("checkpoint of another format", [f"--train.init={D}/otherformat.h5"], ["train.init", "format"]),
    ("checkpoint of a newer version", [f"--train.init={D}/v2.h5"], ["train.init", "version"]),
    ("checkpoint missing a tensor", [f"--train.init={D}/notensor.h5"], ["train.init", "h.1.ln_2.bias"]),
    ("checkpoint tensor of the wrong shape", [f"--train.init={D}/badshape.h5"], ["train.init", "wpe"]),
    ("checkpoint tensor of the wrong dtype", [f"--train.init={D}/float64.h5"], ["train.init", "wte"]),
    ("checkpoint with a NaN", [f"--train.init={D}/nan.h5"], ["train.init", "ln_f.weight"]),
    ("checkpoint whose /model is a dataset", [f"--train.init={D}/modelds.h5"],
     ["train.init", "/model is not a group"]),
    # a tensor made and never written, or written in part (a writer killed part way)
    ("checkpoint tensor never written", [f"--train.init={D}/unwrittends.h5"],
     ["train.init", "unwrittends.h5", "/model/ln_f.weight", "never written"]),
    # a missing source file, a short external file: each had loaded as zeros, exit 0
    ("checkpoint tensor a virtual dataset", [f"--train.init={D}/vdsds.h5"],
     ["train.init", "vdsds.h5", "/model/wte", "stored outside the file"]),
    ("checkpoint tensor in an external file", [f"--train.init={D}/extds.h5"],
     ["train.init", "extds.h5", "/model/ln_f.bias", "stored outside the file"]),
    ("checkpoint tensor written in part", [f"--train.init={D}/partds.h5"],
     ["train.init", "partds.h5", "/model/wte", "written only in part", "6 of its 7 chunks"]),
    # optimizer state that cannot be resumed, refused rather than dropped or run into NaN
    ("checkpoint /optim without t", [f"--train.init={D}/optnot.h5", "--train.steps=3"],
     ["train.init", "optnot.h5", "/optim has no attribute t"]),
    ("checkpoint /optim t < 0", [f"--train.init={D}/optneg.h5", "--train.steps=3"],
     ["train.init", "optneg.h5", "/optim attribute t = -5"]),
    # the step-1 checkpoint's optimizer cannot have taken 5 updates
    ("checkpoint /optim t > step", [f"--train.init={D}/optbig.h5", "--train.steps=3"],
     ["train.init", "optbig.h5", "/optim attribute t = 5", "checkpoint's step 1"]),
    ("checkpoint v < 0", [f"--train.init={D}/vneg.h5", "--train.steps=3"],
     ["train.init", "vneg.h5", "/optim/v/wte", "negative"]),
    # moments that no update made: the next update would take them for one update's
    ("checkpoint /optim t = 0 with moments", [f"--train.init={D}/optzero.h5", "--train.steps=3"],
     ["train.init", "optzero.h5", "/optim/m/", "holds", "t = 0"]),
    # a token far past what the first steps read: still refused before the first step
    ("token >= vocab late in the file", [f"--data.path={D}/latetok.h5"],
     ["data.path", "latetok.h5", "position 450"]),
    # a token no step of the run reads (step 1 reads windows 0..3 of 312), and one in the
    # tail no window holds (497 tokens make 31 windows of 16 + 1): the file is checked
    # whole, so that whether it trains does not depend on train.steps
    ("token >= vocab no step reads", [f"--data.path={D}/unreadtok.h5", "--train.steps=1"],
     ["data.path", "unreadtok.h5", "position 4000"]),
    ("token >= vocab in the tail", [f"--data.path={D}/tailtok.h5", "--train.steps=1"],
     ["data.path", "tailtok.h5", "position 499"]),
    # outputs written after the last step, checked before the first
    ("save is a directory", [f"--train.save={D}"], ["train.save", "is a directory"]),
    ("trace is a directory", ["--profile.timing=kernel", f"--profile.trace={D}"],
     ["profile.trace", "is a directory"]),
    ("save under a file", [f"--train.save={D}/garbage.h5/ck.h5"],
     ["train.save", "garbage.h5 is not a directory"]),
    # root may "write" into an executable file, as access() sees it
    ("report under an executable file", ["--profile.timing=kernel",
                                         f"--profile.report={D}/script.sh/r.json"],
     ["profile.report", "script.sh is not a directory"]),
]


def check(name, args, words, np_ranks=None, r=None):
    """The run of args (made here unless r is given) was refused with one error line that
    holds every one of words"""
    if r is None:
        r = run_train(args, np_ranks=np_ranks, timeout=120)
    err_lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gptc: error:")]
    if r.returncode == 0:
        fail(f"{name}: exit code 0, expected an error")
    # a step's line (step     1/3 | loss ...): whatever the case's step count
    if re.search(r"^step +\d+/\d+ \| loss", r.stdout, re.M):
        fail(f"{name}: training started before the error")
    # every rank finds the same problem, and rank 0 alone reports it
    if len(err_lines) != 1:
        fail(f"{name}: expected one error line, got stderr:\n{r.stderr}")
    for w in words:
        if w not in err_lines[0]:
            fail(f"{name}: error line lacks {w!r}: {err_lines[0]}")
    print(f"ok   {name}: {err_lines[0]}")


def check_all(cases):
    """check() over cases (name, args, words, np_ranks), in their order, their runs four at
    a time: a refused run is mostly its wait for MPI's start-up (0.4 s wall, 0.15 s CPU)"""
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        runs = [pool.submit(run_train, args, np_ranks=np_ranks, timeout=120)
                for _, args, _, np_ranks in cases]
        for (name, args, words, np_ranks), run in zip(cases, runs):
            check(name, args, words, np_ranks, r=run.result())


def check_override_order():
    """A key given twice on the command line: the last wins (README, "Config keys"), over
    the first and over BASE's train.steps = 2"""
    r = run_train(BASE + ["--train.steps=3", "--train.steps=1"], timeout=120)
    if r.returncode or "done: 1 steps" not in r.stdout or "\nsteps = 1\n" not in r.stdout:
        fail(f"--train.steps=3 --train.steps=1: want 1 step and steps = 1 in the effective "
             f"configuration, exit {r.returncode}:\n{r.stdout[-800:]}{r.stderr[-400:]}")
    print("ok   a key given twice: the last wins")


def check_readme_defaults(help_text):
    """The defaults README's key table gives ("| `train.lr lr_schedule ...` | 3e-4 constant
    ... |") are the ones gptc-train --help prints, key by key: a default changed in the
    code and not in the README (or the other way) fails. Cells that are not one literal
    value a key ("from `train.init`") are skipped, and so are derived ones (a word where
    --help prints 0: "n_ctx", "world/(tp*pp)"); "empty" is "". help_text: what --help
    printed (check_help)."""
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")
    table = {}
    for line in open(readme):
        m = re.match(r"\| `([a-z]+)\.([a-z_0-9]+(?: [a-z_0-9]+)*)` \| ([^|]*) \|", line)
        if not m:
            continue
        keys, values = m.group(2).split(), m.group(3).split()
        if len(keys) != len(values):
            continue
        for k, v in zip(keys, values):
            table[f"{m.group(1)}.{k}"] = "" if v == "empty" else v
    printed, section = {}, None
    for line in help_text.splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif " = " in line.rstrip() + " " and section and not line.startswith("#"):
            key, _, value = line.partition(" =")
            printed[f"{section}.{key}"] = value.strip()

    def same(a, b):
        try:
            return float(a) == float(b)
        except ValueError:
            return a == b
    def number(a):
        try:
            return float(a) == float(a)
        except ValueError:
            return False
    # "-" none; a word where --help prints 0 is derived (--help: "0 means ...": n_ctx)
    checked = [k for k, v in table.items()
               if v != "-" and not (printed.get(k) == "0" and not number(v))]
    wrong = [f"{k}: README {table[k]!r}, --help {printed.get(k)!r}" for k in checked
             if k not in printed or not same(table[k], printed[k])]
    if wrong or len(checked) < 35:
        fail(f"README's defaults against --help: {wrong or f'only {len(checked)} keys read'}")
    print(f"ok   README's defaults of {len(checked)} keys are --help's")


def check_help():
    """--help lists every key with its default, as an INI that gptc-train reads back.
    Returns what it printed."""
    r = run_train(["--help"])
    help_text = r.stdout
    keys = [x.split(" = ")[0] for x in r.stdout.splitlines() if " = " in x]
    if r.returncode or len(keys) < 40 or "[overlap]" not in r.stdout or "comm_max_ctas" not in keys:
        fail(f"--help: exit {r.returncode}, {len(keys)} keys:\n{r.stdout}")
    ini = f"{D}/help.ini"
    with open(ini, "w") as f:
        f.write(r.stdout)  # whole: the usage lines are comments
    r = run_train([ini] + BASE + ["--train.steps=0"])
    if r.returncode:
        fail("the defaults --help prints do not read back: " + r.stderr)
    print(f"ok   --help lists {len(keys)} keys with their defaults, and they read back")
    # after a config file and overrides too: help, not a "bad argument"
    r = run_train([ini, "--train.steps=3", "--help"])
    if r.returncode or "[overlap]" not in r.stdout:
        fail(f"--help after other arguments: exit {r.returncode}\n{r.stderr}")
    # booleans in any case, as the error line lists them
    r = run_train(BASE + ["--train.steps=0", "--data.shuffle=TRUE", "--profile.nvtx=Off"])
    if r.returncode:
        fail("--data.shuffle=TRUE --profile.nvtx=Off refused: " + r.stderr)
    print("ok   --help after other arguments; booleans in any case")
    return help_text


def check_whole_chunks():
    """Datasets written whole in chunks that do not divide their extent (HDF5 says
    PART_ALLOCATED of them: the unwritten-chunk check counts the chunks instead) load and
    train, tokens and checkpoint tensors alike, as do chunks written whole with zeros."""
    import h5py
    import shutil
    tokens = np.random.default_rng(3).integers(0, 50, 500)
    tokens[:140] = 0  # two chunks of zeros, written
    with h5py.File(f"{D}/chunked.h5", "w") as f:
        f.create_dataset("tokens", data=tokens.astype(np.uint16), chunks=(70,), compression="gzip")
        f.attrs["vocab_size"] = np.int64(50)
    shutil.copy(f"{D}/ck.h5", f"{D}/chunkedck.h5")
    with h5py.File(f"{D}/chunkedck.h5", "r+") as f:
        wte = f["model/wte"][:]
        del f["model/wte"]
        f["model"].create_dataset("wte", data=wte, chunks=(7, 5))
    r = run_train(BASE + ["--train.steps=1", f"--data.path={D}/chunked.h5",
                          f"--train.init={D}/chunkedck.h5"])
    if r.returncode:
        fail(f"tokens and a tensor in chunks that do not divide them: exit {r.returncode}\n"
             f"{r.stderr}")
    print("ok   tokens and a tensor written whole in chunks that do not divide them train")


def check_locked_by_writer():
    """A checkpoint or token file another program holds open for writing (HDF5's file lock):
    the line names the lock, as HDF5's error stack does, where it said "truncated or
    damaged?" for train.init and nothing for data.path"""
    import shutil
    import h5py
    shutil.copy(f"{D}/ck.h5", f"{D}/lockedck.h5")
    shutil.copy(f"{D}/tok.h5", f"{D}/lockedtok.h5")
    with h5py.File(f"{D}/lockedck.h5", "r+"), h5py.File(f"{D}/lockedtok.h5", "r+"):
        check("train.init held open by a writer", BASE + [f"--train.init={D}/lockedck.h5"],
              ["train.init", "lockedck.h5", "unable to lock file", "open for writing"])
        check("data.path held open by a writer", BASE + [f"--data.path={D}/lockedtok.h5"],
              ["data.path", "lockedtok.h5", "unable to lock file", "open for writing"])


def check_omp_threads():
    """OMP_NUM_THREADS that libgomp cannot use: a huge one crashed the run at its first
    parallel loop (signal 11, no word), a malformed one ran on libgomp's default after a
    warning of its own. Refused by name, also when one rank alone has it."""
    import subprocess
    for v in ("99999999", "abc", "0", "2,", ""):  # empty: libgomp warns, runs its default
        r = run_train(BASE, timeout=120, extra_env={"OMP_NUM_THREADS": v})
        check(f"OMP_NUM_THREADS={v}", None, ["OMP_NUM_THREADS", f"= {v}:", "from 1 to 4096"], r=r)
    r = run_train(BASE + ["--train.steps=1"], timeout=120, extra_env={"OMP_NUM_THREADS": "2,1"})
    if r.returncode:
        fail(f"OMP_NUM_THREADS=2,1 (a thread count a nesting level) refused:\n{r.stderr}")
    cmd = [*MPIRUN, "-np", "1", TRAIN, *BASE, ":", "-np", "1", "env", "OMP_NUM_THREADS=abc",
           TRAIN, *BASE]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env(2))
    check("OMP_NUM_THREADS=abc on rank 1 alone", None, ["rank 1", "OMP_NUM_THREADS = abc"], r=r)
    # an empty OPENBLAS_CORETYPE is unset: gptc's own pick of the kernel family, not
    # OpenBLAS's detection (another family sums in another order); unset here too, not the
    # one the environment may hold (a machine had Haswell, its CPU AVX-512)
    import re
    fam = [re.search(r"OpenBLAS kernels (\S+)",
                     run_train(BASE + ["--train.steps=1"], timeout=120, extra_env=e).stdout)
           for e in ({"OPENBLAS_CORETYPE": None}, {"OPENBLAS_CORETYPE": ""})]
    if not all(fam) or fam[0].group(1) != fam[1].group(1):
        fail(f"OPENBLAS_CORETYPE empty: kernels {[f and f.group(1) for f in fam]}, want the same")


def check_memory_limit():
    """A CPU run whose buffers add up to more than the machine's memory and swap, each of
    them less: Linux let every allocation through, and the OOM killer ended the run at the
    activations' memset (signal 9, no word; gpt2-124m on a 24 GB machine). Refused with one
    line. GPTC_TEST_CPU_MEMORY_BYTES stands in for the machine's memory: 80 MB against
    52 MB of parameters, gradients and moments and 61 MB of activations."""
    args = ["--model.n_layer=1", "--model.n_head=8", "--model.d_model=512", "--model.n_ctx=64",
            "--model.vocab_size=50", f"--data.path={D}/tok.h5", "--train.seq_len=64",
            "--train.global_batch=16", "--train.steps=1"]
    r = run_train(args, timeout=120, extra_env={"GPTC_TEST_CPU_MEMORY_BYTES": "80000000"})
    check("buffers past the machine's memory", None,
          ["out of cpu memory for the activations", "58.5 MiB on top of 49.6 MiB",
           "lower train.micro_batch"], r=r)
    r = run_train(args, timeout=120, extra_env={"GPTC_TEST_CPU_MEMORY_BYTES": "130000000"})
    if r.returncode:
        fail(f"the same run with 130 MB of memory refused:\n{r.stderr[-800:]}")


def check_address_space_limit():
    """Under a low ulimit -v OpenBLAS's buffers can fail to map, and it retries for ever with
    no word (at 0.8 GB a run spun for 9 minutes): a limit under 2 GiB is named before it
    loads. 1.7 GB runs here, with the warning; no limit, no warning."""
    import resource
    import subprocess

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (1700 << 20, resource.RLIM_INFINITY))
    args = BASE + ["--train.steps=1"]
    for limited in (True, False):
        r = subprocess.run([TRAIN, *args], capture_output=True, text=True, timeout=120,
                           env=env(), preexec_fn=limit if limited else None)
        if limited and "AddressSanitizer" in r.stderr:
            print("skip the address space limit: an ASan build reserves more than 1.7 GB")
            return
        warns = [x for x in r.stderr.splitlines() if "(ulimit -v)" in x]
        want = ["gptc: warning: the address space is limited to 1700 MiB (ulimit -v): OpenBLAS "
                "may fail to map its buffers and then retry for ever, in the start-up or in "
                "step 1, with no word; give it 2 GiB or more"] if limited else []
        if r.returncode or warns != want:
            fail(f"ulimit -v {'1.7 GB' if limited else 'unlimited'}: exit {r.returncode}, "
                 f"warnings {warns}, want {want}:\n{r.stderr[-800:]}")
    # two ranks, the limit on rank 1 only (its node's, its wrapper's): that rank says it,
    # naming itself; on both, one line as for one rank
    for ranks_limited in ((1,), (0, 1)):
        cmd = list(MPIRUN)
        for k in range(2):
            pre = ["bash", "-c", 'ulimit -v 1740800 && exec "$@"', "limit"] if k in ranks_limited else []
            cmd += ([":"] if k else []) + ["-np", "1", *pre, TRAIN, *args, "--parallel.dp=2"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env(2))
        warns = [x for x in r.stderr.splitlines() if "(ulimit -v)" in x]
        who = "rank 1: " if ranks_limited == (1,) else ""
        if r.returncode or len(warns) != 1 or not warns[0].startswith(
                f"gptc: warning: {who}the address space is limited to 1700 MiB"):
            fail(f"ulimit -v on rank(s) {ranks_limited} of 2: exit {r.returncode}, warnings "
                 f"{warns}, want one, '{who}the address space ...':\n{r.stderr[-800:]}")
    print("ok   ulimit -v under 2 GiB: named before OpenBLAS loads, by the limited rank; none "
          "without a limit")


def check_config_pipe():
    """A config file that is a pipe (bash's <(...)) is read like a regular one."""
    import shlex
    import subprocess
    ini = f"{D}/pipe.ini"
    with open(ini, "w") as f:
        f.write("[train]\nsteps = 1\n")
    cmd = f"{shlex.quote(TRAIN)} <(cat {shlex.quote(ini)}) " + " ".join(
        shlex.quote(a) for a in BASE if not a.startswith("--train.steps="))
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120, env=env())
    if r.returncode or "step     1/1" not in r.stdout:
        fail(f"a config through a pipe: exit {r.returncode}:\n{r.stderr}")
    print("ok   a config through a pipe trains")


def check_outputs_over_inputs():
    """An output path that names an input file, or another output, is refused before
    anything is written: the file must be byte for byte what it was. By path, through
    "/./", and through a hard link (one inode). train.save = train.init is resuming, and
    allowed (test_resume)."""
    with open(f"{D}/run.ini", "w") as f:
        f.write("[train]\nsteps = 2\n")
    os.link(f"{D}/tok.h5", f"{D}/tok_link.h5")
    cases = [
        ("save over the data", BASE + [f"--train.save={D}/tok.h5"], "tok.h5",
         ["train.save", "is also data.path", "tok.h5", "destroy"]),
        ("save over the data by another path", BASE + [f"--train.save={D}/./tok.h5"], "tok.h5",
         ["train.save", "data.path"]),
        ("save over a hard link of the data", BASE + [f"--train.save={D}/tok_link.h5"], "tok.h5",
         ["train.save", "data.path", "tok_link.h5"]),
        ("log over the checkpoint resumed from",
         BASE + [f"--train.init={D}/ck.h5", f"--train.log_file={D}/ck.h5"], "ck.h5",
         ["train.log_file", "train.init", "ck.h5"]),
        ("trace over the data", BASE + ["--profile.timing=kernel", f"--profile.trace={D}/tok.h5"],
         "tok.h5", ["profile.trace", "data.path"]),
        ("log over the config file", [f"{D}/run.ini"] + BASE + [f"--train.log_file={D}/run.ini"],
         "run.ini", ["train.log_file", "is also the config file", "run.ini"]),
        ("save and trace to one new file",
         BASE + ["--profile.timing=kernel", f"--profile.trace={D}/out.h5", f"--train.save={D}/out.h5"],
         None, ["train.save", "profile.trace", "one file"]),
        ("report and log to one existing file",
         BASE + ["--profile.timing=kernel", f"--profile.report={D}/run.ini",
                 f"--train.log_file={D}/./run.ini"], "run.ini", ["train.log_file", "profile.report"]),
    ]
    for name, args, kept, words in cases:
        before = open(f"{D}/{kept}", "rb").read() if kept else None
        check(name, args, words)
        if kept and open(f"{D}/{kept}", "rb").read() != before:
            fail(f"{name}: {kept} was changed")
        if not kept and os.path.exists(f"{D}/out.h5"):
            fail(f"{name}: out.h5 was written")


def check_long_lines():
    """Lines have no length limit: libinih cut them at 199 characters and read the tail as
    a line of its own, so a long comment could set a key and a long value was cut."""
    ini = f"{D}/long_comment.ini"
    with open(ini, "w") as f:  # the tail past 2 * 199 characters is "steps = 9"
        f.write("[train]\nsteps = 1\n;" + "x" * 198 + ";" + "x" * 198 + "steps = 9\n"
                "[data]\nshuffle = false\n[train]\nseed = 7\n")  # a section may come twice
    r = run_train([ini] + [a for a in BASE if not a.startswith("--train.steps=")], timeout=120)
    if r.returncode or "step     1/1" not in r.stdout:
        fail(f"a 407-character comment line: exit {r.returncode}:\n{r.stdout}\n{r.stderr}")
    print("ok   a 407-character comment line is a comment")
    long_dir = f"{D}/" + "d" * 230
    os.makedirs(long_dir, exist_ok=True)
    path = f"{long_dir}/tok.h5"
    import shutil
    shutil.copy(f"{D}/tok.h5", path)
    ini = f"{D}/long_value.ini"
    with open(ini, "w") as f:
        f.write(f"[data]\npath = {path}\n")
    r = run_train([ini] + [a for a in BASE if not a.startswith("--data.path=")] + ["--train.steps=1"],
                  timeout=120)
    if r.returncode or "step     1/1" not in r.stdout:
        fail(f"a {len(path)}-character data.path: exit {r.returncode}:\n{r.stderr}")
    print(f"ok   a {len(path)}-character data.path is read whole")


def main():
    rng = np.random.default_rng(0)
    write_tokens(f"{D}/tok.h5", rng.integers(0, 50, 500), 50)
    help_text = check_help()
    check_override_order()
    check_readme_defaults(help_text)
    check_config_pipe()
    check_long_lines()
    tokens = rng.integers(0, 50, 500)
    tokens[123] = 60
    write_tokens(f"{D}/big.h5", tokens, 64)
    with open(f"{D}/garbage.h5", "wb") as f:
        f.write(b"not an hdf5 file" * 10)
    with open(f"{D}/script.sh", "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(f"{D}/script.sh", 0o755)
    r = run_train(BASE + ["--train.steps=0", f"--train.save={D}/ck.h5"])
    if r.returncode:
        fail("could not write the reference checkpoint: " + r.stderr)
    import h5py
    with h5py.File(f"{D}/notokens.h5", "w") as f:
        f["ids"] = np.arange(100, dtype=np.uint16)
        f.attrs["vocab_size"] = np.int64(50)
    with h5py.File(f"{D}/lzftok.h5", "w") as f:
        f.create_dataset("tokens", data=np.arange(500, dtype=np.uint16) % 50, compression="lzf")
        f.attrs["vocab_size"] = np.int64(50)
    with h5py.File(f"{D}/unwritten.h5", "w") as f:  # a shape and no data: reads as zeros
        f.create_dataset("tokens", (500,), dtype=np.uint16)
        f.attrs["vocab_size"] = np.int64(50)
    with h5py.File(f"{D}/parttok.h5", "w") as f:  # 5 chunks, the first written
        t = f.create_dataset("tokens", (500,), dtype=np.uint16, chunks=(100,))
        t[:100] = rng.integers(0, 50, 100)
        f.attrs["vocab_size"] = np.int64(50)
    write_tokens(f"{D}/short.h5", np.arange(10) % 50, 50)
    bad = rng.integers(0, 50, 500)
    bad[7] = 55
    write_tokens(f"{D}/badtok.h5", bad, 50)
    # checkpoints broken one way each, from the good one
    import shutil

    def vds_layout():
        lay = h5py.VirtualLayout((50, 32), np.float32)
        lay[:] = h5py.VirtualSource(f"{D}/no_such_source.h5", "wte", shape=(50, 32))
        return lay
    with open(f"{D}/short.bin", "wb") as f:
        f.write(b"\0" * 40)
    raw = open(f"{D}/ck.h5", "rb").read()
    with open(f"{D}/truncated.h5", "wb") as f:
        f.write(raw[: len(raw) // 2])
    for name, change in [
        ("otherformat", lambda f: f.attrs.__setitem__("format", "not-gpt")),
        ("v2", lambda f: f.attrs.__setitem__("version", np.int64(2))),
        ("notensor", lambda f: f["model"].__delitem__("h.1.ln_2.bias")),
        ("modelds", lambda f: (f.__delitem__("model"), f.create_dataset("model", data=np.zeros(3)))),
        ("badshape", lambda f: (f["model"].__delitem__("wpe"),
                                f["model"].create_dataset("wpe", data=np.zeros((8, 32), np.float32)))),
        ("float64", lambda f: (f["model"].__delitem__("wte"),
                               f["model"].create_dataset("wte", data=np.zeros((50, 32), np.float64)))),
        ("nan", lambda f: f["model"]["ln_f.weight"].__setitem__(0, np.float32("nan"))),
        ("unwrittends", lambda f: (f["model"].__delitem__("ln_f.weight"),
                                   f["model"].create_dataset("ln_f.weight", (32,), np.float32))),
        # 7 chunks of 8 rows, the first written
        ("partds", lambda f: (f["model"].__delitem__("wte"),
                              f["model"].create_dataset("wte", (50, 32), np.float32, chunks=(8, 32)),
                              f["model"]["wte"].__setitem__(slice(0, 8),
                                                            np.zeros((8, 32), np.float32)))),
        ("vdsds", lambda f: (f["model"].__delitem__("wte"),
                             f["model"].create_virtual_dataset("wte", vds_layout()))),
        ("extds", lambda f: (f["model"].__delitem__("ln_f.bias"),
                             f["model"].create_dataset("ln_f.bias", (32,), np.float32,
                                                       external=[(f"{D}/short.bin", 0, 128)]))),
        # h5py brings its lzf filter; libhdf5 does not, and a read fails with no reason
        ("lzf", lambda f: (f["model"].__delitem__("ln_f.bias"),
                           f["model"].create_dataset("ln_f.bias", data=np.zeros(32, np.float32),
                                                     compression="lzf"))),
    ]:
        shutil.copy(f"{D}/ck.h5", f"{D}/{name}.h5")
        with h5py.File(f"{D}/{name}.h5", "r+") as f:
            change(f)
    with open(f"{D}/bad.ini", "w") as f:
        f.write("[train]\nsteps = 3\nnot a key value line\n")
    with open(f"{D}/header.ini", "w") as f:  # n_layer would land in [train]
        f.write("[train]\nsteps = 3\n[model\nn_layer = 2\n")
    with open(f"{D}/header2.ini", "w") as f:
        f.write("[train] steps\nsteps = 3\n")
    # libinih joined an indented line to the value above: steps = 7
    with open(f"{D}/indented.ini", "w") as f:
        f.write("[train]\nsteps = 2\n  7\n")
    # libinih stopped at the NUL and ignored the rest
    with open(f"{D}/nul.ini", "wb") as f:
        f.write(b"[train]\nsteps = 2\n\0[train]\nbogus = 1\n")
    with open(f"{D}/huge.ini", "w") as f:
        f.write("[train]\n" + ("#" * 1023 + "\n") * 1100)
    # libinih let the last one win
    with open(f"{D}/twice.ini", "w") as f:
        f.write("[train]\nsteps = 1\n[model]\nn_layer = 2\n[train]\nsteps = 2\n")
    with open(f"{D}/nosection.ini", "w") as f:
        f.write("steps = 2\n[train]\n")
    with open(f"{D}/emptysection.ini", "w") as f:  # misspelt, and no key to be refused by
        f.write("[train]\nsteps = 2\n[dtaa]\n")
    late = rng.integers(0, 50, 500)
    late[450] = 50
    write_tokens(f"{D}/latetok.h5", late, 50)
    unread = rng.integers(0, 50, 5000)
    unread[4000] = 50
    write_tokens(f"{D}/unreadtok.h5", unread, 50)
    tail = rng.integers(0, 50, 500)
    tail[499] = 50
    write_tokens(f"{D}/tailtok.h5", tail, 50)
    # a step-1 checkpoint with optimizer state, broken one way each
    r = run_train(BASE + ["--train.steps=1", f"--train.save={D}/ck1.h5"])
    if r.returncode:
        fail("could not write the step-1 checkpoint: " + r.stderr)
    for name, change in [
        ("optnot", lambda f: f["optim"].attrs.__delitem__("t")),
        ("optneg", lambda f: f["optim"].attrs.__setitem__("t", np.int64(-5))),
        ("optbig", lambda f: f["optim"].attrs.__setitem__("t", np.int64(5))),
        ("vneg", lambda f: f["optim/v/wte"].__setitem__((0, 0), np.float32(-1))),
        ("optzero", lambda f: f["optim"].attrs.__setitem__("t", np.int64(0))),
    ]:
        shutil.copy(f"{D}/ck1.h5", f"{D}/{name}.h5")
        with h5py.File(f"{D}/{name}.h5", "r+") as f:
            change(f)

    check_outputs_over_inputs()
    check_whole_chunks()
    check_locked_by_writer()
    check_omp_threads()
    check_memory_limit()
    check_address_space_limit()
    cases = [(name, BASE + extra, words, None) for name, extra, words in CASES] + [
        ("missing config file", [f"{D}/missing.ini"], ["missing.ini"], None),
        # still one line: the newline in the name is escaped
        ("missing config file with a newline in its name", [f"{D}/no\nsuch.ini"],
         ["no\\nsuch.ini", "No such file"], None),
        ("ini syntax error", [f"{D}/bad.ini"], ["bad.ini", "line 3"], None),
        ("section header without ]", [f"{D}/header.ini"], ["header.ini", "line 3", "syntax error"],
         None),
        ("section header with more on its line", [f"{D}/header2.ini"],
         ["header2.ini", "line 1", "syntax error"], None),
        ("config is a directory", [D] + BASE, ["cannot read", "Is a directory"], None),
        ("indented continuation line", [f"{D}/indented.ini"] + BASE,
         ["indented.ini", "line 3", "syntax error"], None),
        ("NUL byte in the config", [f"{D}/nul.ini"] + BASE, ["nul.ini", "line 3", "NUL byte"],
         None),
        ("config over 1 MiB", [f"{D}/huge.ini"] + BASE, ["huge.ini", "larger than 1 MiB"], None),
        # endless zeros: reading stops at the cap
        ("config is /dev/full", ["/dev/full"] + BASE, ["/dev/full", "larger than 1 MiB"], None),
        ("key set twice in the config", [f"{D}/twice.ini"] + BASE,
         ["twice.ini", "line 6", "train.steps is set twice", "first on line 2"], None),
        ("unknown section without keys", [f"{D}/emptysection.ini"] + BASE,
         ["emptysection.ini", "line 3", "unknown section [dtaa]"], None),
        ("key before any section", [f"{D}/nosection.ini"] + BASE,
         ["nosection.ini", "line 1", "before any [section]"], None),
        # each rank checks its part of the tokens: 450 of 500 is rank 1's, and one line
        ("token >= vocab under mpirun", BASE + ["--parallel.dp=2", f"--data.path={D}/latetok.h5"],
         ["data.path", "position 450", "rank 1"], 2),
        # a checkpoint error every rank meets: one line, from the lowest rank
        ("checkpoint v < 0 under mpirun", BASE + ["--parallel.pp=2", f"--train.init={D}/vneg.h5",
                                                  "--train.steps=3"],
         ["train.init", "/optim/v/wte", "rank 0"], 2),
        # every rank of a multi-rank job exits nonzero; rank 0 names the key
        ("world size under mpirun", BASE + ["--parallel.dp=3"], ["world size 2", "parallel.dp"], 2),
        ("unknown key under mpirun", BASE + ["--train.stpes=3"], ["train.stpes"], 2),
        # micro-batches of each DP rank's rows: 6 rows over dp 2 are 3 a rank, not whole
        # micro-batches of 2 (a check of global_batch % micro_batch alone let dp 2 train on
        # 8 of a batch of 12 rows in micro-batches of 4, without a word)
        ("micro-batches do not divide a DP rank's rows",
         BASE + ["--parallel.dp=2", "--train.global_batch=6", "--train.micro_batch=2"],
         ["train.global_batch = 6", "parallel.dp * train.micro_batch = 2 * 2"], 2),
        ("layers do not divide over stages", BASE + ["--model.n_layer=3", "--parallel.pp=2"],
         ["model.n_layer", "parallel.pp"], 2),
        ("interleaved with micro-batches not a multiple of pp",
         BASE + ["--model.n_layer=4", "--parallel.pp=2", "--parallel.schedule=interleaved",
                 "--parallel.virtual_stages=2", "--train.global_batch=6", "--train.micro_batch=2"],
         ["train.micro_batch", "parallel.pp"], 2),
        ("heads do not divide over tp", BASE + ["--model.n_head=2", "--model.d_model=32",
                                                "--parallel.tp=4"],
         ["model.n_head", "parallel.tp"], 4),
    ]
    # a build without CUDA, or a machine without a GPU, refuses cuda by name on every rank
    if not gpu_present():
        cases += [("cuda without a usable GPU", BASE + ["--train.device=cuda"],
                   ["train.device = cuda"], None),
                  ("cuda without a usable GPU under mpirun", BASE + ["--train.device=cuda"],
                   ["train.device = cuda", "rank"], 2)]
    else:
        print("note: a GPU is present, so the no-GPU cases are not run here")
    check_all(cases)
    print(f"PASS: {len(cases)} bad inputs refused")


if __name__ == "__main__":
    main()
