"""A small PyTorch GPT-2 that mirrors gptc's training semantics exactly.

This is the outside reference of DESIGN section 5: the same model (section 3), the same
checkpoint and token file schemas (section 4), the same window order, loss, AdamW,
clipping and LR schedule. test_parity.py trains it next to gptc-train and compares;
benchmarks/torch_baseline.py times it.

Everything runs on the CPU in float32 by default (float64 is available for measuring
the float32 noise floor). TF32 and other reduced-precision matmul modes only exist on
GPUs, so they cannot change these numbers.
"""
import math
import os
from dataclasses import dataclass

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def set_threads(n=None):
    """Pins torch's intra-op threads: argument, else $GPTC_TORCH_THREADS, else 2."""
    n = int(n or os.environ.get("GPTC_TORCH_THREADS", 2))
    torch.set_num_threads(n)
    return n


# --------------------------------------------------------------------------- model


@dataclass
class ModelConfig:
    n_layer: int
    n_head: int
    d_model: int
    n_ctx: int
    vocab_size: int


def param_shapes(cfg):
    """(name, shape) of every parameter in checkpoint-schema order (DESIGN section 4)."""
    C = cfg.d_model
    out = [("wte", (cfg.vocab_size, C)), ("wpe", (cfg.n_ctx, C))]
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        out += [
            (p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
            (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
            (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
            (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
            (p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
            (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,)),
        ]
    out += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return out


class Conv1D(nn.Module):
    """GPT-2's linear layer: y = x @ W + b with W stored [in, out] (checkpoint layout)."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.empty(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = Conv1D(cfg.d_model, 3 * cfg.d_model)
        self.c_proj = Conv1D(cfg.d_model, cfg.d_model)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        # Columns of c_attn are q | k | v, and within each, head h owns columns h*hs..(h+1)*hs.
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))        # [B, nh, T, T]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)                   # heads back in order
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = Conv1D(cfg.d_model, 4 * cfg.d_model)
        self.c_proj = Conv1D(4 * cfg.d_model, cfg.d_model)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=1e-5)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=1e-5)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """named_parameters() yields exactly the checkpoint names of param_shapes()."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Parameter(torch.empty(cfg.vocab_size, cfg.d_model))
        self.wpe = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=1e-5)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte[idx] + self.wpe[:T]
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.t()          # LM head tied to wte: [B, T, V]

    def loss(self, idx, targets):
        """Mean cross-entropy over all targets of idx."""
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def load_arrays(self, arrays):
        """Copies {name: numpy array} into the parameters; names and shapes must match."""
        params = dict(self.named_parameters())
        missing, extra = set(params) - set(arrays), set(arrays) - set(params)
        if missing or extra:
            raise ValueError(f"parameter names differ: missing {sorted(missing)}, "
                             f"unexpected {sorted(extra)}")
        with torch.no_grad():
            for name, p in params.items():
                a = torch.from_numpy(np.asarray(arrays[name]))
                if tuple(a.shape) != tuple(p.shape):
                    raise ValueError(f"{name}: shape {tuple(a.shape)}, expected {tuple(p.shape)}")
                p.copy_(a)
        return self


# ---------------------------------------------------------------------- checkpoints

META_KEYS = ("n_layer", "n_head", "d_model", "n_ctx", "vocab_size")


def read_checkpoint(path):
    """Returns (ModelConfig, root attrs dict, {name: array} of /model)."""
    with h5py.File(path, "r") as f:
        attrs = {k: f.attrs[k] for k in f.attrs}
        cfg = ModelConfig(**{k: int(attrs[k]) for k in META_KEYS})
        arrays = {name: f["model"][name][()] for name in f["model"]}
    return cfg, attrs, arrays


def load_model(path, dtype=torch.float32):
    """A GPT2 holding the /model tensors of the gptc checkpoint at path."""
    cfg, _, arrays = read_checkpoint(path)
    return GPT2(cfg).load_arrays(arrays).to(dtype)


def init_arrays(cfg, seed):
    """GPT-2 init (DESIGN section 3) from seeded numpy, in schema order.

    Not gptc's counter-based RNG: the parity test feeds both sides the same checkpoint,
    so only the distribution has to match, not the draws."""
    rng = np.random.default_rng(seed)
    proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    out = {}
    for name, shape in param_shapes(cfg):
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            a = np.ones(shape)
        elif name.endswith(".bias"):
            a = np.zeros(shape)
        elif name.endswith("c_proj.weight"):       # residual projections, attn and mlp
            a = rng.normal(0.0, proj_std, shape)
        else:
            a = rng.normal(0.0, 0.02, shape)
        out[name] = a.astype(np.float32)
    return out


def write_checkpoint(path, cfg, arrays, step=0):
    """Writes a gptc checkpoint (schema of DESIGN section 4) without /optim."""
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "gpt-ckpt"                 # h5py stores a variable-length UTF-8 string
        f.attrs["version"] = np.int64(1)
        f.attrs["step"] = np.int64(step)
        for k in META_KEYS:
            f.attrs[k] = np.int64(getattr(cfg, k))
        g = f.create_group("model")
        for name, _ in param_shapes(cfg):
            g.create_dataset(name, data=np.asarray(arrays[name], dtype=np.float32))


def write_init_checkpoint(path, cfg, seed=1234):
    write_checkpoint(path, cfg, init_arrays(cfg, seed))


def write_tokens(path, tokens, vocab_size):
    """Token file: uint16 dataset /tokens and int64 root attribute vocab_size."""
    tokens = np.asarray(tokens)
    if tokens.min() < 0 or tokens.max() >= vocab_size or vocab_size > 65536:
        raise ValueError("tokens must lie in [0, vocab_size) with vocab_size <= 65536")
    with h5py.File(path, "w") as f:
        f.create_dataset("tokens", data=tokens.astype(np.uint16))
        f.attrs["vocab_size"] = np.int64(vocab_size)


def random_tokens(n, vocab_size, seed):
    return np.random.default_rng(seed).integers(0, vocab_size, size=n)


# ----------------------------------------------------------------------------- data


class Windows:
    """The batch order of DESIGN section 3 (data.shuffle = false).

    The N tokens are cut into W = floor((N-1)/T) windows of T+1 tokens overlapping by one;
    optimizer step s (1-based) takes windows ((s-1)*B + j) % W for j = 0..B-1, as rows."""

    def __init__(self, tokens, T, B):
        self.tokens = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
        self.T, self.B = T, B
        self.W = (len(self.tokens) - 1) // T
        if self.W < 1:
            raise ValueError(f"{len(self.tokens)} tokens hold no window of {T + 1}")

    @classmethod
    def from_file(cls, path, T, B):
        with h5py.File(path, "r") as f:
            return cls(f["tokens"][()], T, B)

    def window_ids(self, step):
        return [((step - 1) * self.B + j) % self.W for j in range(self.B)]

    def batch(self, step):
        """(inputs, targets), both int64 [B, T]."""
        rows = torch.stack([self.tokens[w * self.T: w * self.T + self.T + 1]
                            for w in self.window_ids(step)])
        return rows[:, :-1], rows[:, 1:]


# ------------------------------------------------------------------------- training


@dataclass
class TrainConfig:
    """The [train] keys that change the math (DESIGN section 4), with gptc's defaults."""
    steps: int
    global_batch: int
    seq_len: int
    micro_batch: int = 0            # 0: the whole global batch in one pass
    lr: float = 3e-4
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0


def lr_at(step, tc):
    """LR used by the update of step (1-based): linear warm-up, then constant or cosine."""
    if tc.warmup_steps > 0 and step <= tc.warmup_steps:
        return tc.lr * step / tc.warmup_steps
    if tc.lr_schedule == "constant":
        return tc.lr
    progress = (step - tc.warmup_steps) / max(1, tc.steps - tc.warmup_steps)
    return tc.min_lr + 0.5 * (tc.lr - tc.min_lr) * (1.0 + math.cos(math.pi * progress))


def param_groups(model, weight_decay):
    """Decay only tensors of 2+ dims (wte, wpe, the Conv1D weights), not biases or LN."""
    params = list(model.parameters())
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def make_optimizer(model, tc):
    """AdamW; foreach=False selects PyTorch's plain per-tensor loop, the semantics gptc copies."""
    return torch.optim.AdamW(param_groups(model, tc.weight_decay), lr=tc.lr,
                             betas=(tc.beta1, tc.beta2), eps=tc.eps, foreach=False)


def forward_backward(model, x, y, micro_batch=0):
    """Accumulates the gradient of the batch-mean loss over micro-batches of rows.

    Each micro-batch's mean loss is weighted by its share of the rows, so the sum is the
    mean over all B*T targets, as in gptc. Returns that loss as a float."""
    B = x.shape[0]
    mb = micro_batch or B
    total = 0.0
    for r in range(0, B, mb):
        loss = model.loss(x[r:r + mb], y[r:r + mb]) * (x[r:r + mb].shape[0] / B)
        loss.backward()
        total += loss.item()
    return total


def clip_grads(params, max_norm):
    """Global-norm clipping, coef = min(1, max_norm / (norm + 1e-6)) applied to every
    gradient; returns the norm before clipping. Each Parameter counts once, so the tied
    wte (one Parameter used twice) is counted once."""
    return torch.nn.utils.clip_grad_norm_(params, max_norm).item()


def train(model, data, tc, optimizer=None, clip=clip_grads, on_step=None):
    """Trains steps 1..tc.steps; returns (history, optimizer).

    history[s-1] = {"step", "loss", "grad_norm", "lr"}: the loss before step s's update,
    the gradient norm before clipping and the LR of that update. optimizer (default
    make_optimizer) and clip exist so tests can swap in deliberately wrong variants;
    on_step(step, model, opt) runs after each update, if given."""
    opt = optimizer or make_optimizer(model, tc)
    params = list(model.parameters())
    history = []
    for step in range(1, tc.steps + 1):
        x, y = data.batch(step)
        opt.zero_grad(set_to_none=True)
        loss = forward_backward(model, x, y, tc.micro_batch)
        norm = clip(params, tc.grad_clip)
        lr = lr_at(step, tc)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        history.append({"step": step, "loss": loss, "grad_norm": norm, "lr": lr})
        if on_step:
            on_step(step, model, opt)
    return history, opt


def optimizer_state(model, opt):
    """{name: (exp_avg, exp_avg_sq)} as numpy, plus the step count t."""
    out, t = {}, None
    for name, p in model.named_parameters():
        st = opt.state[p]
        out[name] = (st["exp_avg"].detach().numpy(), st["exp_avg_sq"].detach().numpy())
        t = int(st["step"])
    return out, t
