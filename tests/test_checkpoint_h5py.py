"""Checkpoints cross between C and h5py in both directions (DESIGN section 4).

usage: /usr/bin/python3 test_checkpoint_h5py.py TEST_CHECKPOINT_BINARY [DIR]

1. The C test writes c_written.h5 (`--write`); h5py checks schema, dtypes and values.
2. h5py writes py_written.h5 the way a conversion script would (format as a Python str,
   integer attributes of mixed widths); the C test reads it back (`--check`).
3. h5py writes bad files (version 2, a float64 dataset, attributes vocab_size or n_ctx
   that the embeddings do not have); the C test must refuse them with a message naming
   the problem.
The reference content must match ref_tensors/ref_value in tests/test_checkpoint.c.
"""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

META = {"step": 42, "n_layer": 1, "n_head": 3, "d_model": 3, "n_ctx": 4, "vocab_size": 5}
OPTIM_T = 42
TENSORS = [("wte", (5, 3)), ("wpe", (4, 3)), ("h.0.ln_1.weight", (3,)),
           ("h.0.attn.c_attn.weight", (3, 9))]
GROUPS = ["model", "optim/m", "optim/v"]


def check(ok, msg):
    """An assert that PYTHONOPTIMIZE cannot remove."""
    if not ok:
        print(f"FAIL: {msg}")
        sys.exit(1)


def ref_array(group, k, shape):
    i = np.arange(int(np.prod(shape)), dtype=np.int64)
    vals = (i * 37 + (k + 10 * group) * 101) % 257 - 128
    return (vals / 64.0).astype(np.float32).reshape(shape)


def as_text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def check_c_written(path):
    with h5py.File(path, "r") as f:
        fmt = f.attrs["format"]
        check(fmt == "gpt-ckpt", f"format attribute reads as {fmt!r}")
        check(isinstance(fmt, str), f"format should read as str, got {type(fmt)}")
        for key, want in [("version", 1)] + list(META.items()):
            v = f.attrs[key]
            check(v == want and v.dtype == np.int64, f"attribute {key} = {v!r} ({v.dtype})")
        check(f["optim"].attrs["t"] == OPTIM_T, f"/optim t = {f['optim'].attrs['t']!r}")
        for g, group in enumerate(GROUPS):
            names = sorted(f[group].keys())
            check(names == sorted(n for n, _ in TENSORS), f"/{group} holds {names}")
            for k, (name, shape) in enumerate(TENSORS):
                d = f[group][name]
                check(d.dtype == np.float32, f"/{group}/{name} is {d.dtype}")
                check(d.shape == shape, f"/{group}/{name} has shape {d.shape}")
                check(np.array_equal(d[()], ref_array(g, k, shape)), f"/{group}/{name} values")
    print(f"h5py checked {path}")


def write_py(path, version=1, float64_name=None, attrs=None):
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "gpt-ckpt"  # h5py: variable-length UTF-8 string
        f.attrs["version"] = np.int64(version)
        f.attrs["step"] = np.int32(META["step"])        # other integer widths must work
        f.attrs["n_layer"] = np.uint16(META["n_layer"])
        for key in ("n_head", "d_model", "n_ctx", "vocab_size"):
            f.attrs[key] = META[key]                    # plain int: int64
        for g, group in enumerate(GROUPS):
            for k, (name, shape) in enumerate(TENSORS):
                a = ref_array(g, k, shape)
                f[f"{group}/{name}"] = a.astype(np.float64) if name == float64_name else a
        f["optim"].attrs["t"] = np.int64(OPTIM_T)
        for key, v in (attrs or {}).items():
            f.attrs[key] = np.int64(v)


def run_c(binary, *args):
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    out = r.stdout + r.stderr
    print(f"$ {os.path.basename(binary)} {' '.join(args)}  -> exit {r.returncode}\n{out.strip()}")
    return r.returncode, out


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    binary = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="gptc_ckpt_py_") as tmp:
        d = sys.argv[2] if len(sys.argv) == 3 else tmp
        os.makedirs(d, exist_ok=True)

        c_path = os.path.join(d, "c_written.h5")
        rc, out = run_c(binary, "--write", c_path)
        check(rc == 0, "C writer failed")
        check_c_written(c_path)

        py_path = os.path.join(d, "py_written.h5")
        write_py(py_path)
        rc, out = run_c(binary, "--check", py_path)
        check(rc == 0, "C reader refused the h5py-written checkpoint")

        for name, kwargs, words in [
            ("py_v2.h5", {"version": 2}, ["py_v2.h5", "version 2"]),
            ("py_f64.h5", {"float64_name": "wpe"}, ["/model/wpe", "float64"]),
            # attributes the tensors do not have: refused at the open, before a model of
            # 2^30 rows is sized from them
            ("py_vocab.h5", {"attrs": {"vocab_size": 2**30}},
             ["/model/wte has shape [5, 3]", "vocab_size = 1073741824"]),
            ("py_nctx.h5", {"attrs": {"n_ctx": 7}}, ["/model/wpe has shape [4, 3]", "n_ctx = 7"]),
        ]:
            bad = os.path.join(d, name)
            write_py(bad, **kwargs)
            rc, out = run_c(binary, "--check", bad)
            check(rc != 0, f"C reader accepted {name}")
            for w in words:
                check(w in out, f"message for {name} lacks {w!r}: {out}")
    print("checkpoint h5py cross-check passed")


if __name__ == "__main__":
    main()
