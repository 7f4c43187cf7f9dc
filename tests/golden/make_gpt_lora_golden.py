#!/work/venv-peers/bin/python
"""Writes tests/golden/gpt_lora_tiny.safetensors: one LoRA finetuning step of
a tiny GPT-2 (Hugging Face transformers' GPT2LMHeadModel) with rank-4
adapters on all four linears of each block, for tests/golden/test_gpt_golden.cpp.

LoRA as peft computes it, written out here (peft does not run with the
transformers 4.38 of the peers' environment): every adapted linear (HF's
Conv1D c_attn, attn.c_proj, c_fc, mlp.c_proj) gives
    base(x) + (x @ A.T) @ B.T * (alpha / rank)
with A [rank, in] and B [out, rank]; every base weight is frozen. A and B
are both random here (peft starts B at zero, which would leave A without a
gradient), so every adapter's gradient is checked.

The model: vocabulary 97, context 16, width 32, 2 layers, 2 heads, no
dropout; rank 4, alpha 8 (scale 2). The file holds, under pooch's names:
  w.<name>      every weight (base weights transposed to [out, in] where
                HF's Conv1D stores [in, out]; w.<linear>.lora_A.weight,
                w.<linear>.lora_B.weight)
  tokens, targets  i32 [B, T] (-1 ignored)
  logits [B, T, V], loss [1]
  g.<adapter>   the loss's gradient for each adapter (the only trainable
                weights)
  adamw.losses  [10] the loss before each of 10 AdamW steps on the batch
                (lr 1e-3, decay 0.1: adapters are matrices)
The reference values come from a float64 run of the f32 weights.

Run with the peers' virtual environment:
    /work/venv-peers/bin/python tests/golden/make_gpt_lora_golden.py
"""
import os

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import save_file
from transformers import GPT2Config, GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "gpt_lora_tiny.safetensors")

V, T, C, L, H, B = 97, 16, 32, 2, 2, 2
RANK, ALPHA = 4, 8.0
TARGETS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, steps=10)

torch.manual_seed(20241202)
cfg = GPT2Config(vocab_size=V, n_positions=T, n_embd=C, n_layer=L, n_head=H,
                 activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                 attn_pdrop=0.0, layer_norm_epsilon=1e-5)


class LoraConv1D(torch.nn.Module):
    """HF's Conv1D (y = x @ W + b, W [in, out]) with a LoRA adapter."""

    def __init__(self, base):
        super().__init__()
        self.base = base
        n_in, n_out = base.weight.shape
        self.A = torch.nn.Parameter(0.2 * torch.randn(RANK, n_in))
        self.B = torch.nn.Parameter(0.2 * torch.randn(n_out, RANK))

    def forward(self, x):
        return self.base(x) + (x @ self.A.T) @ self.B.T * (ALPHA / RANK)


def make_model():
    m = GPT2LMHeadModel(cfg).eval()
    for blk in m.transformer.h:
        blk.attn.c_attn = LoraConv1D(blk.attn.c_attn)
        blk.attn.c_proj = LoraConv1D(blk.attn.c_proj)
        blk.mlp.c_fc = LoraConv1D(blk.mlp.c_fc)
        blk.mlp.c_proj = LoraConv1D(blk.mlp.c_proj)
    return m


model = make_model()
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith((".A", ".B")):
            continue
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            p.copy_(1.0 + 0.1 * torch.randn_like(p))
        elif name.endswith(".bias"):
            p.copy_(0.05 * torch.randn_like(p))
        else:
            p.copy_(0.15 * torch.randn_like(p))


def pooch_name(hf):
    """transformer.h.0.attn.c_attn.base.weight -> h.0.attn.c_attn.weight,
    ...c_attn.A -> h.0.attn.c_attn.lora_A.weight."""
    n = hf[len("transformer."):] if hf.startswith("transformer.") else hf
    n = n.replace(".base.", ".")
    if n.endswith(".A") or n.endswith(".B"):
        n = n[:-2] + ".lora_" + n[-1] + ".weight"
    return n


def to_pooch(hf, t):
    a = t.detach().cpu().numpy()
    if hf.endswith(".base.weight"):
        a = a.T  # Conv1D stores [in, out]; pooch's linear takes [out, in]
    return np.ascontiguousarray(a.astype(np.float32))


out = {}
for n, p in model.named_parameters():
    if n != "lm_head.weight":
        out["w." + pooch_name(n)] = to_pooch(n, p)

g = torch.Generator().manual_seed(11)
tokens = torch.randint(0, V, (B, T), generator=g)
targets = torch.full((B, T), -1, dtype=torch.long)
targets[:, :-1] = tokens[:, 1:]
targets[0, 3] = -1
out["tokens"] = tokens.numpy().astype(np.int32)
out["targets"] = targets.numpy().astype(np.int32)

m64 = make_model().double()
m64.load_state_dict(model.state_dict())
adapters = []
for n, p in m64.named_parameters():
    p.requires_grad_(n.endswith((".A", ".B")))
    if p.requires_grad:
        adapters.append((n, p))
assert len(adapters) == 2 * len(TARGETS) * L


def loss_of(m):
    logits = m(tokens).logits
    return logits, F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1)


logits, loss = loss_of(m64)
loss.backward()
out["logits"] = logits.detach().numpy().astype(np.float32)
out["loss"] = np.array([loss.item()], dtype=np.float32)
for n, p in adapters:
    out["g." + pooch_name(n)] = to_pooch(n, p.grad)

opt = torch.optim.AdamW([p for _, p in adapters], lr=ADAMW["lr"], betas=ADAMW["betas"],
                        eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"])
losses = []
for _ in range(ADAMW["steps"]):
    opt.zero_grad()
    _, l = loss_of(m64)
    losses.append(l.item())
    l.backward()
    opt.step()
out["adamw.losses"] = np.array(losses, dtype=np.float32)

save_file(out, OUT, metadata={"made_by": "tests/golden/make_gpt_lora_golden.py",
                              "transformers": __import__("transformers").__version__,
                              "rank": str(RANK), "alpha": str(ALPHA)})
print(f"wrote {OUT}: {os.path.getsize(OUT)} bytes; loss {loss.item():.6f}; "
      f"adamw losses {losses[0]:.6f} -> {losses[-1]:.6f}")
