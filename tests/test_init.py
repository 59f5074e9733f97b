"""The random initialisation (gpt_init_random), as GPT-2's (and its checkpoint's step 0
and shape attributes): every weight matrix and the
embeddings normal with std 0.02, except the projections into the residual stream
(attn.c_proj, mlp.c_proj), std 0.02 / sqrt(2 n_layer); LayerNorm weights 1, every bias 0.
Read from the checkpoint a run with train.steps = 0 writes. Nothing else checks the init
itself: the parity test starts from PyTorch's, and the layouts compare gptc with gptc."""
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gptc_testlib import fail, run_train, work_dir, write_tokens  # noqa: E402

D = work_dir("gptc_init_")
N_LAYER, N_HEAD, D_MODEL, N_CTX = 4, 2, 64, 32  # n_layer and n_head apart: a swap shows
MODEL = [f"--model.n_layer={N_LAYER}", f"--model.n_head={N_HEAD}", f"--model.d_model={D_MODEL}",
         f"--model.n_ctx={N_CTX}", "--model.vocab_size=256", f"--data.path={D}/tok.h5",
         "--train.global_batch=4", "--train.steps=0"]


def init(name, extra=()):
    r = run_train(MODEL + [f"--train.save={D}/{name}.h5", *extra])
    if r.returncode:
        fail(f"{name}: the run failed: {r.stderr[-600:]}")
    with h5py.File(f"{D}/{name}.h5") as f:
        attrs = {k: int(f.attrs[k]) for k in ("step", "n_layer", "n_head", "d_model", "n_ctx",
                                              "vocab_size")}
        want = {"step": 0, "n_layer": N_LAYER, "n_head": N_HEAD, "d_model": D_MODEL,
                "n_ctx": N_CTX, "vocab_size": 256}
        if attrs != want:
            fail(f"{name}: the initialisation's checkpoint says {attrs}, want {want}")
        return {k: f["model"][k][()] for k in f["model"]}


def want_std(name):
    if name.endswith("c_proj.weight"):
        return 0.02 / np.sqrt(2 * N_LAYER)
    return 0.02


def main():
    write_tokens(f"{D}/tok.h5", np.random.default_rng(3).integers(0, 256, 2000), 256)
    p = init("seed1337")
    if len(p) != 4 + 12 * N_LAYER:
        fail(f"{len(p)} tensors, want {4 + 12 * N_LAYER}: {sorted(p)}")
    for name, v in p.items():
        if name.endswith("bias"):
            ok, what = not v.any(), "all 0"
        elif ".ln_" in name or name.startswith("ln_f"):
            ok, what = bool((v == 1).all()), "all 1"
        else:
            # the sample std of n normals is within 4 of its standard errors, std/sqrt(2n);
            # the mean within 4 of std/sqrt(n)
            n, s = v.size, want_std(name)
            ok = abs(v.std() - s) < 4 * s / np.sqrt(2 * n) and abs(v.mean()) < 4 * s / np.sqrt(n)
            what = f"mean 0, std {s:.5f} (got mean {v.mean():.2e}, std {v.std():.5f}, n {n})"
        if not ok:
            fail(f"init of {name}: want {what}")
    print(f"ok   {len(p)} tensors: std 0.02, residual projections "
          f"{0.02 / np.sqrt(2 * N_LAYER):.5f}, LayerNorm 1, biases 0")
    again, other = init("again"), init("seed7", ["--train.seed=7"])
    if any(not np.array_equal(p[k], again[k]) for k in p):
        fail("two runs with one seed initialised differently")
    same = [k for k in p if p[k].std() > 0 and np.array_equal(p[k], other[k])]
    if same:
        fail(f"seeds 1337 and 7 gave the same {same[0]}")
    print("ok   one seed gives one init, another seed another")
    print("PASS: the initialisation is GPT-2's")


if __name__ == "__main__":
    main()
