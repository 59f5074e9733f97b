#!/usr/bin/python3
"""PyTorch eager baseline for gptc's CPU throughput: the reference GPT-2 of
tests/torch_gpt2.py trained with AdamW on synthetic tokens.

Each step does what a gptc step does: forward and backward over the batch, global-norm
clipping, an AdamW update. Prints one JSON line:
  {"impl": "pytorch-eager", "ms_per_step": ..., "tokens_per_s": ..., "peak_rss_mb": ..., ...}
ms_per_step is the median over the steps after 2 warm-up steps (the first steps pay for
allocation and page faults, which a long run does not).

Run with Debian's /usr/bin/python3 (it has python3-torch).
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import torch_gpt2 as tg  # noqa: E402

WARMUP_STEPS = 2


def parse_args():
    ap = argparse.ArgumentParser(description="PyTorch eager GPT-2 training throughput")
    ap.add_argument("--n_layer", type=int, default=4)
    ap.add_argument("--n_head", type=int, default=4)
    ap.add_argument("--d_model", type=int, default=256)
    ap.add_argument("--n_ctx", type=int, default=0, help="position table size (default: --seq)")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=10, help="including the 2 warm-up steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()
    if args.steps <= WARMUP_STEPS:
        ap.error(f"--steps must exceed the {WARMUP_STEPS} warm-up steps")
    if min(args.n_layer, args.n_head, args.d_model, args.seq, args.batch, args.vocab,
           args.threads) < 1 or args.d_model % args.n_head:
        ap.error("need positive sizes and --d_model a multiple of --n_head")
    if args.n_ctx and args.n_ctx < args.seq:
        ap.error(f"--n_ctx {args.n_ctx} is shorter than --seq {args.seq}")
    return args


def init_gpt2_(model, seed):
    """GPT-2 init (DESIGN section 3), in place with torch's RNG.

    Not tg.init_arrays: that draws float64 numpy arrays, whose temporaries would show up
    in the peak RSS we report (about 1 GB extra at 124M)."""
    gen = torch.Generator().manual_seed(seed)
    proj_std = 0.02 / math.sqrt(2 * model.cfg.n_layer)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif "ln_" in name:                  # LayerNorm weights
                p.fill_(1.0)
            else:
                p.normal_(0.0, proj_std if name.endswith("c_proj.weight") else 0.02,
                          generator=gen)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # Linux: KiB


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    cfg = tg.ModelConfig(args.n_layer, args.n_head, args.d_model, args.n_ctx or args.seq,
                         args.vocab)
    model = tg.GPT2(cfg)
    init_gpt2_(model, args.seed)
    tc = tg.TrainConfig(steps=args.steps, global_batch=args.batch, seq_len=args.seq)
    opt = tg.make_optimizer(model, tc)
    params = list(model.parameters())
    # Enough synthetic tokens that no window repeats, read in gptc's window order.
    n_tokens = args.steps * args.batch * args.seq + 1
    tokens = np.random.default_rng(args.seed).integers(0, args.vocab, n_tokens)
    data = tg.Windows(tokens, args.seq, args.batch)

    times_ms = []
    for step in range(1, args.steps + 1):
        x, y = data.batch(step)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = tg.forward_backward(model, x, y)
        tg.clip_grads(params, tc.grad_clip)
        opt.step()
        times_ms.append((time.perf_counter() - t0) * 1e3)
        print(f"step {step}: loss {loss:.4f} {times_ms[-1]:.1f} ms", file=sys.stderr)

    ms = statistics.median(times_ms[WARMUP_STEPS:])
    print(json.dumps({
        "impl": "pytorch-eager",
        "ms_per_step": round(ms, 3),
        "tokens_per_s": round(args.batch * args.seq / (ms / 1e3), 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in params),
        "shape": {"n_layer": args.n_layer, "n_head": args.n_head, "d_model": args.d_model,
                  "n_ctx": cfg.n_ctx, "seq": args.seq, "batch": args.batch,
                  "vocab": args.vocab, "steps": args.steps},
    }))


if __name__ == "__main__":
    main()
