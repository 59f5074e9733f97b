#!/usr/bin/env python3
"""PyTorch peer of gptc's GPU benchmark: GPT-2 124M training throughput on one GPU.

The model is GPT-2 small as gptc builds it: pre-LayerNorm blocks, causal self-attention
through F.scaled_dot_product_attention(is_causal=True), tanh-approximated GELU, learned
position embeddings, LM head tied to the token embedding. The vocabulary of 50257 is
padded to 50304 rows (a multiple of 128, as gptc pads it); as in gptc, the loss is taken
over the 50257 real columns only.

A step is what a gptc step is: forward, backward, global-norm gradient clipping (1.0),
and AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1 on the 2-D parameters only,
fused=True where the installed torch has it). The tokens are one fixed random batch
(seeded) that stays on the device, so no input pipeline is timed.

--precision fp32: TF32 off for matmuls and cuDNN, so the work runs on the FP32 units.
--precision bf16: torch.autocast(bfloat16) around forward and loss; weights, gradients
and optimizer state stay FP32 (mixed precision).

Output: one JSON line,
  {"impl": "torch", "precision", "compile", "micro_batch", "T", "ms_per_step",
   "tokens_per_s", "mfu", "peak_tflops", "gpu", "max_mem_gib", ...}
ms_per_step is the mean over --steps timed steps after --warmup untimed ones.
MFU = flops_per_token * tokens_per_s / peak, with flops_per_token = 6*P + 12*L*T*d
(PaLM appendix B / nanoGPT): P counts every parameter, the padded wte included (it is
the LM head too, and its padded rows are multiplied like the others); 12*L*T*d is the
attention score and value work. Peak: H100 and H200 (same GH100 chip) dense BF16 989
TFLOP/s, FP32 67 TFLOP/s; --peak-tflops overrides; unknown GPUs get mfu null.

--find-max-batch tries micro-batches 64, 48, 32, 24, 16, 12, 8, 4 and reports the
largest that runs 2 steps without running out of memory.

The size flags (--n-layer, --d-model, ...) exist for smoke tests on a CPU:
  python3 torch_gpt2.py --device cpu --n-layer 2 --d-model 64 --n-head 2 --T 32 --micro-batch 2
"""
import argparse
import gc
import inspect
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 50257
PAD_TO = 128                        # gptc pads the vocabulary to a multiple of 128
PEAKS = {                           # dense TFLOP/s: name fragment -> {precision: peak}
    "H100": {"bf16": 989.0, "fp32": 67.0},
    "H200": {"bf16": 989.0, "fp32": 67.0},
}
BATCHES_TO_TRY = (64, 48, 32, 24, 16, 12, 8, 4)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--T", type=int, default=1024, help="sequence length")
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--n-ctx", type=int, default=1024, help="position table size (>= T)")
    ap.add_argument("--vocab", type=int, default=VOCAB, help="real vocabulary (padded to 128)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--clip", type=float, default=1.0, help="global grad-norm clip; 0: none")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="peak for the MFU (default: from the GPU name and precision)")
    ap.add_argument("--find-max-batch", action="store_true")
    a = ap.parse_args()
    if a.n_ctx < a.T:
        a.n_ctx = a.T
    if a.d_model % a.n_head:
        ap.error("--d-model must be a multiple of --n-head")
    if a.steps < 1 or a.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    return a


class Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:                       # torch < 2.0 (Debian's CPU torch): the same, by hand
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.attn_proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, n_layer, n_head, d, n_ctx, vocab):
        super().__init__()
        self.vocab = vocab
        self.vocab_padded = (vocab + PAD_TO - 1) // PAD_TO * PAD_TO
        self.wte = nn.Embedding(self.vocab_padded, d)
        self.wpe = nn.Embedding(n_ctx, d)
        self.h = nn.ModuleList(Block(d, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.init_weights(n_layer)

    def init_weights(self, n_layer):
        """GPT-2's: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), zero biases."""
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif name.startswith("ln_") or ".ln_" in name:
                nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)        # tied LM head
        # the padded columns are not classes: leave them out of the softmax, as gptc does
        logits = logits[..., :self.vocab]
        return F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))


def make_optimizer(model, device):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    kw = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    fused = device.type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
    if fused:
        kw["fused"] = True
    return torch.optim.AdamW(groups, **kw), fused


def peak_for(gpu_name, precision, override):
    if override:
        return override
    for frag, peaks in PEAKS.items():
        if frag in (gpu_name or ""):
            return peaks[precision]
    return None


def is_oom(e):
    oom_t = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom_t is not None and isinstance(e, oom_t)) or "out of memory" in str(e).lower()


class Trainer:
    def __init__(self, a, device, batch):
        torch.manual_seed(a.seed)
        self.a, self.device, self.batch = a, device, batch
        self.model = GPT2(a.n_layer, a.n_head, a.d_model, a.n_ctx, a.vocab).to(device)
        self.opt, self.fused = make_optimizer(self.model, device)
        self.fwd = torch.compile(self.model) if a.compile else self.model
        g = torch.Generator(device="cpu").manual_seed(a.seed)
        data = torch.randint(0, a.vocab, (batch, a.T + 1), generator=g)
        self.x = data[:, :-1].contiguous().to(device)
        self.y = data[:, 1:].contiguous().to(device)
        self.autocast = a.precision == "bf16"

    def step(self):
        if self.autocast:
            with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
                loss = self.fwd(self.x, self.y)
        else:
            loss = self.fwd(self.x, self.y)
        loss.backward()
        if self.a.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.a.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def find_max_batch(a, device):
    tried = {}
    best = None
    for b in BATCHES_TO_TRY:
        tr = None
        try:
            tr = Trainer(a, device, b)
            for _ in range(2):
                tr.step()
            sync(device)
            tried[b] = "ok"
            best = b
        except Exception as e:      # noqa: BLE001 - any OOM flavour, incl. compile's
            if not is_oom(e):
                raise
            tried[b] = "oom"
        finally:
            del tr
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if best is not None:
            break
    return best, tried


def main():
    a = parse_args()
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_gpt2: CUDA is not available (use --device cpu for a smoke test)")
    if a.precision == "fp32" and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if a.compile and not hasattr(torch, "compile"):
        sys.exit(f"torch_gpt2: torch {torch.__version__} has no torch.compile (needs 2.0)")
    if a.precision == "bf16" and device.type == "cpu" and not hasattr(torch, "autocast"):
        sys.exit("torch_gpt2: this torch has no torch.autocast")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    base = {"impl": "torch", "precision": a.precision, "compile": a.compile, "T": a.T}

    if a.find_max_batch:
        best, tried = find_max_batch(a, device)
        print(json.dumps({**base, "find_max_batch": best, "tried": tried, "gpu": gpu,
                          "torch": torch.__version__}), flush=True)
        return 0 if best is not None else 1

    tr = Trainer(a, device, a.micro_batch)
    for _ in range(a.warmup):
        tr.step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = tr.step()
    sync(device)
    dt = (time.perf_counter() - t0) / a.steps

    n_params = sum(p.numel() for p in tr.model.parameters())
    tokens = a.micro_batch * a.T
    tps = tokens / dt
    flops_per_token = 6 * n_params + 12 * a.n_layer * a.T * a.d_model
    peak = peak_for(gpu, a.precision, a.peak_tflops)
    mfu = flops_per_token * tps / (peak * 1e12) if peak else None
    max_mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    print(json.dumps({
        **base, "micro_batch": a.micro_batch, "ms_per_step": round(dt * 1e3, 3),
        "tokens_per_s": round(tps, 1), "mfu": None if mfu is None else round(mfu, 4),
        "peak_tflops": peak, "gpu": gpu,
        "max_mem_gib": None if max_mem is None else round(max_mem, 3),
        "n_params": n_params, "flops_per_token": flops_per_token, "warmup": a.warmup,
        "steps": a.steps, "loss": round(float(loss.detach()), 4), "fused_adamw": tr.fused,
        "vocab": a.vocab, "vocab_padded": tr.model.vocab_padded, "n_layer": a.n_layer,
        "n_head": a.n_head, "d_model": a.d_model, "torch": torch.__version__,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
