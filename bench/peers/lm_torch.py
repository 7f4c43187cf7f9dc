#!/work/venv-peers/bin/python
"""The PyTorch peer of bench/lm: Hugging Face transformers' GPT2LMHeadModel
with random weights, the shapes and threads pooch-bench-lm takes, trained
with torch.optim.AdamW (decay on matrices only), then greedy generation with
model.generate and its KV cache. Prints one JSON object with the same keys
as pooch-bench-lm (arena_mib: null).

    lm_torch.py [--layers 12] [--heads 12] [--width 768] [--vocab 50257]
                [--ctx 256] [--batch 1] [--steps 3] [--threads 2]
                [--gen-tokens 32] [--prompt 16] [--device cpu|cuda]

--device cuda (tests/device/run.sh, beside pooch-bench-lm --device cuda):
the model on the GPU in f32 with TF32 off, as pooch computes; each timed
step ends with torch.cuda.synchronize(); "peak_device_mib" is
torch.cuda.max_memory_allocated (pooch's counterpart is its arena).
"""
import argparse
import json
import resource
import time

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

ap = argparse.ArgumentParser()
for k, v in dict(layers=12, heads=12, width=768, vocab=50257, ctx=256, batch=1, steps=3,
                 threads=2, gen_tokens=32, prompt=16).items():
    ap.add_argument("--" + k.replace("_", "-"), type=int, default=v)
ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
a = ap.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(1)
dev = torch.device(a.device)
if a.device == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def sync():
    if a.device == "cuda":
        torch.cuda.synchronize()


cfg = GPT2Config(vocab_size=a.vocab, n_positions=max(a.ctx, a.prompt + a.gen_tokens),
                 n_embd=a.width, n_layer=a.layers, n_head=a.heads, resid_pdrop=0.0,
                 embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new",
                 bos_token_id=a.vocab - 1, eos_token_id=a.vocab - 1)  # GPT-2's own at 50257
model = GPT2LMHeadModel(cfg).to(dev)
decay = [p for p in model.parameters() if p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                         {"params": no_decay, "weight_decay": 0.0}], lr=1e-4)
n = a.batch * a.ctx
idx = torch.arange(n)
tokens = ((idx * 7919) % a.vocab).reshape(a.batch, a.ctx).to(dev)
targets = (((idx + 1) * 7919) % a.vocab).reshape(a.batch, a.ctx).to(dev)
model.train()
times = []
for _ in range(a.steps):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    logits = model(tokens).logits
    loss = F.cross_entropy(logits.reshape(-1, a.vocab), targets.reshape(-1))
    loss.backward()
    opt.step()
    sync()
    times.append(time.perf_counter() - t0)
warm = sorted(times[1:] if len(times) > 1 else times)
step = warm[len(warm) // 2]

model.eval()
prompt = torch.tensor([[(i * 31) % a.vocab for i in range(a.prompt)]]).to(dev)
with torch.no_grad():
    # Untimed first: the first call's set-up (kernels loaded on first use,
    # on a GPU) would otherwise fall in the one-token run subtracted below.
    model.generate(prompt, do_sample=False, max_new_tokens=2, pad_token_id=0,
                   attention_mask=torch.ones_like(prompt))
    # The prompt and first token, then the rest: time the rest, as pooch does.
    t0 = time.perf_counter()
    model.generate(prompt, do_sample=False, max_new_tokens=1, pad_token_id=0,
                   attention_mask=torch.ones_like(prompt))
    sync()
    t1 = time.perf_counter()
    model.generate(prompt, do_sample=False, max_new_tokens=a.gen_tokens, pad_token_id=0,
                   attention_mask=torch.ones_like(prompt), min_new_tokens=a.gen_tokens)
    sync()
    t2 = time.perf_counter()
gen_s = (t2 - t1) - (t1 - t0)
print(json.dumps({"train_step_s": step, "train_tokens_s": n / step,
                  "gen_tokens_s": (a.gen_tokens - 1) / gen_s,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                  "peak_device_mib": (torch.cuda.max_memory_allocated() / 2**20
                                      if a.device == "cuda" else None),
                  "arena_mib": None, "backend": "torch " + torch.__version__ + " " + a.device}))
