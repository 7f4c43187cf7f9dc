#!/work/venv-peers/bin/python
"""Writes tests/golden/gpt_tiny.safetensors: a tiny GPT-2 computed by Hugging
Face transformers (GPT2LMHeadModel), for tests/golden/test_gpt_golden.cpp.

The model: vocabulary 97, context 16, width 32, 2 layers, 2 heads, no
dropout, random weights (wider than GPT-2's initialisation, so that every
path carries signal). The file holds, under pooch's weight names (Hugging
Face's without "transformer."; Conv1D weights transposed to [out, in]):

  w.<name>      the initial weights (f32, exactly what pooch loads)
  tokens        i32 [B, T] a batch of token ids
  targets       i32 [B, T] the next token of each position, -1 = ignored
                (the last position, and one more to test ignoring)
  logits        [B, T, V]  GPT2LMHeadModel's logits
  g.<name>      the gradient of the loss for every weight
  adamw.losses  [10] the loss before each of 10 AdamW steps on the batch
                (decay 0.1 on weights of rank 2, none on biases and
                layernorms; lr 1e-3)
  adamw_clip.losses  [10] the same with the gradients clipped to global
                norm 0.5 before each step (clip_grad_norm_; every step clips)
  prompt        i32 [P] and generated i32 [N]: model.generate(prompt,
                do_sample=False, max_new_tokens=N), the new tokens only
  loss          [1]

logits, g.*, loss and adamw.losses come from a float64 run of the same
model (the f32 weights widened), stored as f32: the reference pooch's f32
computation is compared with. `generated` comes from the f32 model, as a
user would run it. The format is safetensors (8-byte header length, JSON
header, data), read by a few lines of C++ in the test.

Run with the peers' virtual environment (transformers 4.38):
    /work/venv-peers/bin/python tests/golden/make_gpt_train_golden.py
"""
import os

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import save_file
from transformers import GPT2Config, GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "gpt_tiny.safetensors")

V, T, C, L, H, B = 97, 16, 32, 2, 2, 2
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, steps=10)
PROMPT, NEW = [5, 17, 42, 3], 10
CLIP = 0.5  # gradient clipping's max_norm for adamw_clip.losses

torch.manual_seed(20240601)
cfg = GPT2Config(vocab_size=V, n_positions=T, n_embd=C, n_layer=L, n_head=H,
                 activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                 attn_pdrop=0.0, layer_norm_epsilon=1e-5)
model = GPT2LMHeadModel(cfg).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
            p.copy_(1.0 + 0.1 * torch.randn_like(p))
        elif name.endswith(".bias"):
            p.copy_(0.05 * torch.randn_like(p))
        else:
            p.copy_(0.15 * torch.randn_like(p))

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def pooch_name(hf):
    return hf[len("transformer."):] if hf.startswith("transformer.") else hf


def to_pooch(hf, t):
    a = t.detach().cpu().numpy()
    if hf.endswith(CONV1D):
        a = a.T  # Conv1D stores [in, out]; pooch's linear takes [out, in]
    return np.ascontiguousarray(a.astype(np.float32))


params = [(n, p) for n, p in model.named_parameters() if n != "lm_head.weight"]
out = {}
for n, p in params:
    out["w." + pooch_name(n)] = to_pooch(n, p)

g = torch.Generator().manual_seed(7)
tokens = torch.randint(0, V, (B, T), generator=g)
targets = torch.full((B, T), -1, dtype=torch.long)
targets[:, :-1] = tokens[:, 1:]
targets[1, 5] = -1  # an ignored position inside a row
out["tokens"] = tokens.numpy().astype(np.int32)
out["targets"] = targets.numpy().astype(np.int32)


def loss_of(m):
    logits = m(tokens).logits
    return logits, F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1)


# Generation first, from the f32 model as a user runs it.
with torch.no_grad():
    gen = model.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=NEW,
                         pad_token_id=0, attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long))
out["prompt"] = np.array(PROMPT, dtype=np.int32)
out["generated"] = gen[0, len(PROMPT):].numpy().astype(np.int32)

m64 = GPT2LMHeadModel(cfg).eval().double()
m64.load_state_dict(model.state_dict())
m64 = m64.double()
logits, loss = loss_of(m64)
loss.backward()
out["logits"] = logits.detach().numpy().astype(np.float32)
out["loss"] = np.array([loss.item()], dtype=np.float32)
for n, p in m64.named_parameters():
    if n == "lm_head.weight":
        continue
    out["g." + pooch_name(n)] = to_pooch(n, p.grad)

# PyTorch's own float32 run against the float64 reference, measured as the
# C++ test measures pooch (error relative to each tensor's largest value).
f32_logits, f32_loss = loss_of(model)
f32_loss.backward()
worst = np.abs(f32_logits.detach().numpy() - out["logits"]).max() / np.abs(out["logits"]).max()
for n, p in model.named_parameters():
    if n != "lm_head.weight":
        ref = out["g." + pooch_name(n)]
        worst = max(worst, np.abs(to_pooch(n, p.grad) - ref).max() / np.abs(ref).max())
model.zero_grad()

# 10 AdamW steps on the same batch, in float64 from the same start.
m64.zero_grad()
decay = [p for n, p in m64.named_parameters() if p.dim() >= 2 and n != "lm_head.weight"]
no_decay = [p for n, p in m64.named_parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                         {"params": no_decay, "weight_decay": 0.0}],
                        lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"])
losses = []
for _ in range(ADAMW["steps"]):
    opt.zero_grad()
    _, l = loss_of(m64)
    losses.append(l.item())
    l.backward()
    opt.step()
out["adamw.losses"] = np.array(losses, dtype=np.float32)

# The same 10 steps with the gradients clipped to global norm CLIP first
# (torch.nn.utils.clip_grad_norm_), from the same start: every step clips.
m64 = GPT2LMHeadModel(cfg).eval().double()
m64.load_state_dict(model.state_dict())
m64 = m64.double()
decay = [p for n, p in m64.named_parameters() if p.dim() >= 2 and n != "lm_head.weight"]
no_decay = [p for n, p in m64.named_parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                         {"params": no_decay, "weight_decay": 0.0}],
                        lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"])
clip_losses, norms = [], []
for _ in range(ADAMW["steps"]):
    opt.zero_grad()
    _, l = loss_of(m64)
    clip_losses.append(l.item())
    l.backward()
    norms.append(torch.nn.utils.clip_grad_norm_(m64.parameters(), CLIP).item())
    opt.step()
assert min(norms) > CLIP, norms
out["adamw_clip.losses"] = np.array(clip_losses, dtype=np.float32)

save_file(out, OUT, metadata={"made_by": "tests/golden/make_gpt_train_golden.py",
                              "transformers": __import__("transformers").__version__})
print(f"wrote {OUT}: {os.path.getsize(OUT)} bytes; loss {loss.item():.6f}; "
      f"adamw losses {losses[0]:.6f} -> {losses[-1]:.6f}; generated {out['generated'].tolist()}; "
      f"PyTorch f32 vs the f64 reference: {worst:.3g} of each tensor's scale")
