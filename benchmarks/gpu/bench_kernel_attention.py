#!/usr/bin/env python3
"""gptc's causal attention kernels against PyTorch's scaled_dot_product_attention, at
GPT-2 124M shapes, on one GPU, in the same run.

Rows (one JSON line each in $GPTC_BENCH_OUT/attention.jsonl, a table in attention.md), for
every shape of GPTC_BENCH_ATTN_SHAPES (BxTxNHxhs, default 8x1024x12x64, 32x1024x12x64,
8x1024x6x128) and precision fp32 and bf16, direction forward, backward and
forward+backward:
  gptc: $GPTC_BUILD/attention_bench (the launchers of engine/cuda/cuda_kernels.h, qkv in
    gptc's layout [B,T,3C]); the backward includes its rowsum(dout * out) step.
  gptc-plain: the same, bf16, with GPTC_ATTENTION_GROUP past B * NH: the blocks in the
    plain order, without the grouping of (b, h) pairs for the L2 (attention_grid in
    engine/cuda/cuda_common.cuh), so the table shows what the grouping gains.
  gptc-rows64: the same, bf16 at hs 64, with GPTC_ATTENTION_FWD_ROWS=64: the forward
    with 64 queries a block, one m-tile a warp, not the default's 128 (two m-tiles a warp;
    attention_bf16_fwd.cu); the backward is the same kernels as gptc's.
  gptc-pipelined: the same, bf16 at hs 64, with GPTC_ATTENTION_FWD=pipelined: the forward
    takes the next key tile's scores while it works through this tile's softmax and P V
    (the same results bit for bit); the backward is the same kernels as gptc's.
  gptc-wide: the same, bf16 at hs 64, with GPTC_ATTENTION_FWD=wide: the forward in flash
    attention 2's shape, 128 queries by 128 keys a block (one softmax rescaling per 128
    keys); the backward is the same kernels as gptc's.
  gptc-biaspass, gptc-biasfused: the same, bf16 at hs 64, the backward also taking the
    qkv bias gradient as training's does (GPTC_BENCH_QKV_BIAS=1): by a pass of
    cuda_bias_backward after the kernels (GPTC_ATTENTION_BIAS=0), or by the kernels
    themselves (GPTC_ATTENTION_BIAS=1, the default); their backward times say which costs less.
  gptc-dqfused: the same, bf16 at hs 64, with GPTC_ATTENTION_DQ=fused: the backward's dk/dv
    kernel also takes dq's part of each tile pair (dS K), which a summing kernel adds up,
    instead of the dq kernel recomputing S, dP and dS (5 products a tile pair, not 7).
  gptc-dqatomic: the same with GPTC_ATTENTION_DQ=atomic: the parts added by fp32 atomics
    into one dq (as flash attention 2), which the same kernel then rounds.
  torch: F.scaled_dot_product_attention(is_causal=True) on q, k, v [B,NH,T,hs]: bf16 on
    the flash backend (forced), fp32 on the backend torch picks (named in the row; TF32
    off). The forward runs on inputs that require grad (it then saves the lse, as gptc's
    does); the backward is torch.autograd.grad over one retained forward graph.
Each time is the mean of GPTC_BENCH_ATTN_ITERS calls (default 20) after
GPTC_BENCH_ATTN_WARMUP (3), between CUDA events. TFLOP/s two ways: causal (the kept
T(T+1)/2 pairs; forward 2 products x 2 x B x NH x T(T+1)/2 x hs, backward 2.5x, as
FlashAttention counts) and dense (all T^2 pairs, the non-causal count).

Time: GPTC_BENCH_ATTN_BUDGET_S (default 90) for the whole script, a timeout on every run;
a run that fails, times out or would start without budget is recorded as a failed row.
Exit status: 1 when no gptc row ran (as bench_gpt2.py when no gptc micro-batch ran),
else 0, whatever the torch rows did.

Internal: `bench_kernel_attention.py --torch-worker B T NH hs warmup iters` runs the torch
rows of one shape in a subprocess (a hang or crash then costs one timeout, not the run)."""
import contextlib
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("GPTC_BUILD", os.path.join(ROOT, "build"))
OUT = os.environ.get("GPTC_BENCH_OUT", os.path.join(ROOT, "gpu-results", "bench_kernel_attention"))
BUDGET_S = float(os.environ.get("GPTC_BENCH_ATTN_BUDGET_S", "90"))
SHAPES = os.environ.get("GPTC_BENCH_ATTN_SHAPES", "8x1024x12x64,32x1024x12x64,8x1024x6x128")
WARMUP = int(os.environ.get("GPTC_BENCH_ATTN_WARMUP", "3"))
ITERS = int(os.environ.get("GPTC_BENCH_ATTN_ITERS", "20"))
RUN_TIMEOUT_S = 45  # one attention_bench or torch worker run
MIN_START_S = 5     # a run is not started with less budget left
PRECISIONS = ("fp32", "bf16")
DIRECTIONS = ("forward", "backward", "forward+backward")
ROW_KEYS = {"impl", "B", "T", "NH", "hs", "precision", "direction"}
FACTOR = {"forward": 1.0, "backward": 2.5, "forward+backward": 3.5}  # of the forward's FLOPs
START = time.time()


def left():
    return BUDGET_S - (time.time() - START)


def flops(B, T, NH, hs, direction):
    """(causal, dense) FLOPs of one call"""
    f = FACTOR[direction] * 4.0 * B * NH * hs
    return f * T * (T + 1) / 2, f * T * T


def complete(row):
    """adds the FLOP counts and TFLOP/s to a row with B, T, NH, hs, direction and ms"""
    fc, fd = flops(row["B"], row["T"], row["NH"], row["hs"], row["direction"])
    row.update(flops_causal=fc, flops_dense=fd, tflops_causal=fc / (row["ms"] * 1e9),
               tflops_dense=fd / (row["ms"] * 1e9))
    return row


# ---------------------------------------------------------------- the torch worker
def torch_worker(B, T, NH, hs, warmup, iters):
    import torch
    import torch.nn.functional as F

    def fail(precision, msg):
        for d in DIRECTIONS:
            print(json.dumps({"impl": "torch", "precision": precision, "direction": d, "B": B,
                              "T": T, "NH": NH, "hs": hs, "error": msg[:300]}), flush=True)

    if not torch.cuda.is_available():
        for p in PRECISIONS:
            fail(p, "torch sees no CUDA device")
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gpu = torch.cuda.get_device_name()

    def flash_only():
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
        except ImportError:  # torch < 2.3
            return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False,
                                                  enable_mem_efficient=False)

    def picked(q, k, v):
        """the name of the backend torch picks for these inputs (a private API: may fail)"""
        try:
            from torch.nn.attention import SDPBackend
            i = torch._fused_sdp_choice(q, k, v, None, 0.0, True)
            return next((n for n, b in SDPBackend.__members__.items() if int(b.value) == i),
                        str(i)).lower()
        except Exception as e:  # noqa: BLE001: only a label
            return f"unknown ({type(e).__name__})"

    def timed(fn):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(iters):
            fn()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1) / iters

    rc = 0
    for precision in PRECISIONS:
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        try:
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, dout = (torch.randn(B, NH, T, hs, device="cuda", dtype=dtype, generator=g)
                             for _ in range(4))  # [B,NH,T,hs] each
            q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
            ctx = flash_only() if precision == "bf16" else contextlib.nullcontext()
            with ctx:
                backend = "flash_attention (forced)" if precision == "bf16" else picked(q, k, v)

                def fwd():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

                out = fwd()
                grads = []

                def bwd():
                    grads[:] = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

                def fwd_bwd():
                    torch.autograd.grad(fwd(), (q, k, v), dout)

                ms = {"forward": timed(fwd), "backward": timed(bwd),
                      "forward+backward": timed(fwd_bwd)}
                finite = bool(torch.isfinite(out).all()) and all(
                    bool(torch.isfinite(t).all()) for t in grads)
            del out, grads, q, k, v, dout
            if not finite:
                fail(precision, "non-finite outputs")
                rc = 1
                continue
            for d in DIRECTIONS:
                print(json.dumps(complete({
                    "impl": "torch", "gpu": gpu, "precision": precision, "direction": d,
                    "B": B, "T": T, "NH": NH, "hs": hs, "layout": "q,k,v[B,NH,T,hs]",
                    "backend": backend, "torch": torch.__version__, "warmup": warmup,
                    "iters": iters, "ms": ms[d], "finite": True})), flush=True)
        except Exception as e:  # noqa: BLE001: a row that failed, then the next precision
            fail(precision, f"{type(e).__name__}: {e}")
            rc = 1
        torch.cuda.empty_cache()
    return rc


# ---------------------------------------------------------------- the driver
def record(rows, row):
    print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "attention.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    rows.append(row)
    write_table(rows)  # after every row: a run killed from outside still leaves its table


def run_rows(impl, tag, shape, args, precisions, rows, env=None):
    """runs args (which print JSON rows; output in <tag>_<shape>.log) with env added to the
    environment, records their rows as impl's, and a failed row for every (precision,
    direction) of precisions they did not print"""
    B, T, NH, hs = shape
    base = {"impl": impl, "B": B, "T": T, "NH": NH, "hs": hs}
    log = os.path.join(OUT, f"{tag}_b{B}_t{T}_nh{NH}_hs{hs}.log")
    stdout, err = "", None
    if left() < MIN_START_S:
        err = "skipped: budget spent"
    else:
        try:
            r = subprocess.run(args, capture_output=True, text=True,
                               timeout=min(RUN_TIMEOUT_S, max(left(), 1)),
                               env=dict(os.environ, **(env or {})))
            stdout, stderr = r.stdout, r.stderr
            if r.returncode:
                err = (stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
        except subprocess.TimeoutExpired as e:
            stdout, stderr = e.stdout or "", e.stderr or ""
            stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
            stderr = stderr.decode() if isinstance(stderr, bytes) else stderr
            err = "timeout"
        except OSError as e:  # no binary, not executable
            stderr = ""
            err = f"{type(e).__name__}: {e}"
        with open(log, "w") as f:
            f.write(f"$ {' '.join(args)}\n{stdout}{stderr}")
    done = set()
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict) or not ROW_KEYS <= row.keys() or not (
                "ms" in row or "error" in row):
            continue
        row["impl"] = impl
        record(rows, row)
        done.add((row.get("precision"), row.get("direction")))
    for p in precisions:
        for d in DIRECTIONS:
            if (p, d) not in done:
                record(rows, dict(base, precision=p, direction=d, error=(err or "no row")[:300]))


def fmt(x, spec):
    return format(x, spec) if x is not None else ""


def write_table(rows):
    ok = {(r["impl"], r["B"], r["T"], r["NH"], r["hs"], r["precision"], r["direction"]): r
          for r in rows if "error" not in r}
    gpus = sorted({r["gpu"] for r in ok.values() if "gpu" in r})
    keys = []
    for r in rows:
        k = (r["B"], r["T"], r["NH"], r["hs"], r["precision"], r["direction"])
        if k not in keys:
            keys.append(k)
    with open(os.path.join(OUT, "attention.md"), "w") as f:
        f.write(f"Causal attention, gptc kernels against torch SDPA, one GPU: "
                f"{' / '.join(gpus) or 'unknown (no row ran)'}\n\n")
        f.write(f"Mean of {ITERS} calls after {WARMUP} warm-up; TFLOP/s counts the causal "
                f"FLOPs (T(T+1)/2 pairs; backward 2.5x forward); ratio = gptc ms / torch ms "
                f"(above 1: gptc slower).\n\n")
        f.write("gptc plain ms: the same kernels in the plain block order (no L2 grouping of "
                "the (b, h) pairs: GPTC_ATTENTION_GROUP past B * NH). gptc rows64 ms: bf16 "
                "at hs 64 with GPTC_ATTENTION_FWD_ROWS=64 (the forward with 64 queries a "
                "block). pipelined ms: bf16 at hs 64 with GPTC_ATTENTION_FWD=pipelined (the "
                "forward's next scores under this tile's softmax). wide ms: bf16 at hs 64 with "
                "GPTC_ATTENTION_FWD=wide (128 queries by 128 keys a block). "
                "bias pass / bias fused ms: "
                "bf16 at hs 64, the backward also taking "
                "the qkv bias gradient, by a pass after the kernels or by the kernels "
                "(GPTC_ATTENTION_BIAS=1). dq fused ms: bf16 at hs 64 with "
                "GPTC_ATTENTION_DQ=fused (dq's parts from the dk/dv kernel, then summed). "
                "dq atomic ms: the same with GPTC_ATTENTION_DQ=atomic (the parts added by "
                "atomics).\n\n")
        f.write("| shape B,T,NH,hs | precision | direction | gptc ms | gptc plain ms | "
                "gptc rows64 ms | pipelined ms | wide ms | bias pass ms | bias fused ms | "
                "dq fused ms | dq atomic ms | torch ms | ratio | gptc TFLOP/s | "
                "torch TFLOP/s | torch backend | note |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for k in keys:
            g, t = ok.get(("gptc",) + k), ok.get(("torch",) + k)
            gp = ok.get(("gptc-plain",) + k)
            g64 = ok.get(("gptc-rows64",) + k)
            gpl = ok.get(("gptc-pipelined",) + k)
            gwd = ok.get(("gptc-wide",) + k)
            gbp, gbf = ok.get(("gptc-biaspass",) + k), ok.get(("gptc-biasfused",) + k)
            gdq, gda = ok.get(("gptc-dqfused",) + k), ok.get(("gptc-dqatomic",) + k)
            errs = [f"{r['impl']}: {r['error']}" for r in rows if "error" in r and
                    (r["B"], r["T"], r["NH"], r["hs"], r["precision"], r["direction"]) == k]
            ratio = g["ms"] / t["ms"] if g and t else None
            f.write(f"| {k[0]},{k[1]},{k[2]},{k[3]} | {k[4]} | {k[5]} | "
                    f"{fmt(g and g['ms'], '.3f')} | {fmt(gp and gp['ms'], '.3f')} | "
                    f"{fmt(g64 and g64['ms'], '.3f')} | {fmt(gpl and gpl['ms'], '.3f')} | "
                    f"{fmt(gwd and gwd['ms'], '.3f')} | "
                    f"{fmt(gbp and gbp['ms'], '.3f')} | "
                    f"{fmt(gbf and gbf['ms'], '.3f')} | {fmt(gdq and gdq['ms'], '.3f')} | "
                    f"{fmt(gda and gda['ms'], '.3f')} | "
                    f"{fmt(t and t['ms'], '.3f')} | "
                    f"{fmt(ratio, '.2f')} | {fmt(g and g['tflops_causal'], '.1f')} | "
                    f"{fmt(t and t['tflops_causal'], '.1f')} | {t['backend'] if t else ''} | "
                    f"{'; '.join(errs)} |\n")


def main():
    if len(sys.argv) == 8 and sys.argv[1] == "--torch-worker":
        return torch_worker(*(int(a) for a in sys.argv[2:]))
    os.makedirs(OUT, exist_ok=True)
    open(os.path.join(OUT, "attention.jsonl"), "w").close()
    rows = []
    binary = os.path.join(BUILD, "attention_bench")
    for s in SHAPES.split(","):
        shape = tuple(int(x) for x in s.strip().split("x"))
        if len(shape) != 4:
            print(f"GPTC_BENCH_ATTN_SHAPES: '{s}' is not BxTxNHxhs", file=sys.stderr)
            return 2
        dims = [str(x) for x in shape]
        # one precision per attention_bench run: a failure of one keeps the other's rows
        for p in PRECISIONS:
            run_rows("gptc", f"gptc_{p}", shape, [binary] + dims + [p, str(WARMUP), str(ITERS)],
                     [p], rows)
        # bf16 in the plain block order as well: what grouping the (b, h) pairs for the L2
        # (attention_grid in engine/cuda/cuda_common.cuh) gains or costs, in the same run
        run_rows("gptc-plain", "gptc_plain_bf16", shape,
                 [binary] + dims + ["bf16", str(WARMUP), str(ITERS)], ["bf16"], rows,
                 {"GPTC_ATTENTION_GROUP": str(1 << 30)})
        if shape[3] == 64:
            run_rows("gptc-rows64", "gptc_rows64_bf16", shape,
                     [binary] + dims + ["bf16", str(WARMUP), str(ITERS)], ["bf16"], rows,
                     {"GPTC_ATTENTION_FWD_ROWS": "64"})
            for impl, how in (("gptc-pipelined", "pipelined"), ("gptc-wide", "wide")):
                run_rows(impl, impl.replace("-", "_") + "_bf16", shape,
                         [binary] + dims + ["bf16", str(WARMUP), str(ITERS)], ["bf16"], rows,
                         {"GPTC_ATTENTION_FWD": how})
            for impl, fused in (("gptc-biaspass", "0"), ("gptc-biasfused", "1")):
                run_rows(impl, impl.replace("-", "_") + "_bf16", shape,
                         [binary] + dims + ["bf16", str(WARMUP), str(ITERS)], ["bf16"], rows,
                         {"GPTC_BENCH_QKV_BIAS": "1", "GPTC_ATTENTION_BIAS": fused})
            for impl, how in (("gptc-dqfused", "fused"), ("gptc-dqatomic", "atomic")):
                run_rows(impl, impl.replace("-", "_") + "_bf16", shape,
                         [binary] + dims + ["bf16", str(WARMUP), str(ITERS)], ["bf16"], rows,
                         {"GPTC_ATTENTION_DQ": how})
        worker = [sys.executable, os.path.abspath(__file__), "--torch-worker"]
        run_rows("torch", "torch", shape, worker + dims + [str(WARMUP), str(ITERS)], PRECISIONS,
                 rows)
    write_table(rows)
    print(open(os.path.join(OUT, "attention.md")).read())
    if not any(r["impl"] == "gptc" and "error" not in r for r in rows):
        print("no gptc attention row ran; see the logs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
