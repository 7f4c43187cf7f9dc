#!/usr/bin/env python3
"""GPT-2 checkpoint goldens for tests/unit/test_gpt_checkpoint.cpp.

Writes, under tests/golden/lm/:
  hf_tiny/            GPT2LMHeadModel(n_layer=2, n_head=2, n_embd=8,
                      n_positions=16, vocab_size=50), every parameter drawn
                      from N(0, 1) with seed 0, saved by save_pretrained
                      (config.json + model.safetensors)
  llmc_tiny_f32.bin   the same weights as llm.c's train_gpt2.py writes them
                      (version 3: float32, wte padded to 128 rows)
  llmc_tiny_bf16.bin  version 5 (bfloat16)

With --check DIR it loads DIR (a directory `pooch-run export` or the C++
test wrote) with GPT2LMHeadModel.from_pretrained and checks that every
weight and the logits of a fixed sequence equal hf_tiny's.

Run with /work/venv-peers/bin/python (transformers 4.38, torch).
"""
import os
import struct
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lm")


def tiny():
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=8, n_positions=16, vocab_size=50,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    m = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_()
    return m


def write_llmc(model, path, version):
    cfg = model.config
    sd = model.state_dict()
    V, C, L, T = cfg.vocab_size, cfg.n_embd, cfg.n_layer, cfg.n_positions
    Vp = (V + 127) // 128 * 128
    header = [0] * 256
    header[0:8] = [20240326, version, T, V, L, cfg.n_head, C, Vp]
    wte = torch.zeros(Vp, C)
    wte[:V] = sd["transformer.wte.weight"]
    def stack(key, transpose):
        ts = [sd[f"transformer.h.{i}.{key}"] for i in range(L)]
        return torch.stack([t.t() if transpose else t for t in ts])
    parts = [wte, sd["transformer.wpe.weight"],
             stack("ln_1.weight", False), stack("ln_1.bias", False),
             stack("attn.c_attn.weight", True), stack("attn.c_attn.bias", False),
             stack("attn.c_proj.weight", True), stack("attn.c_proj.bias", False),
             stack("ln_2.weight", False), stack("ln_2.bias", False),
             stack("mlp.c_fc.weight", True), stack("mlp.c_fc.bias", False),
             stack("mlp.c_proj.weight", True), stack("mlp.c_proj.bias", False),
             sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"]]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        for p in parts:
            p = p.contiguous()
            if version == 5:
                f.write(p.to(torch.bfloat16).view(torch.int16).numpy().tobytes())
            else:
                f.write(p.to(torch.float32).numpy().tobytes())


def main():
    ref = tiny()
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        got = GPT2LMHeadModel.from_pretrained(sys.argv[2]).eval()
        a, b = ref.state_dict(), got.state_dict()
        for k, v in a.items():
            assert torch.equal(v, b[k]), k
        ids = torch.tensor([[1, 7, 49, 0, 23, 5, 5, 12]])
        with torch.no_grad():
            la, lb = ref(ids).logits, got(ids).logits
        assert torch.equal(la, lb)
        print(f"{sys.argv[2]}: from_pretrained loads it; {len(a)} tensors and the logits equal the original")
        return
    out = os.path.join(HERE, "hf_tiny")
    ref.save_pretrained(out, safe_serialization=True)
    gen = os.path.join(out, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    write_llmc(ref, os.path.join(HERE, "llmc_tiny_f32.bin"), 3)
    write_llmc(ref, os.path.join(HERE, "llmc_tiny_bf16.bin"), 5)
    print("wrote", out, "and the llm.c files")


if __name__ == "__main__":
    main()
