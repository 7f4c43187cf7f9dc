#!/work/venv-peers/bin/python
"""Writes tests/golden/lm/hf_tiny_generate.json: the tokens Hugging Face
transformers' GPT2LMHeadModel.generate gives the checkpoint in
tests/golden/lm/hf_tiny (vocabulary 50, context 16) by greedy decoding, for
tests/cli/test_lm_cli.sh, which imports that directory with `pooch-run
import` and checks `pooch-run generate --temperature 0` against them.

Two prompts: one short, and one whose continuation runs to the end of the
context (16 tokens), which is where pooch's generation stops too.

Run with the peers' virtual environment (transformers 4.38):
    /work/venv-peers/bin/python tests/golden/make_gpt_generate_golden.py
"""
import json
import os

import torch
from transformers import GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
model = GPT2LMHeadModel.from_pretrained(os.path.join(HERE, "lm", "hf_tiny")).eval()
cases = []
for prompt, new in (([7, 3, 41, 0, 12], 8), ([1, 2, 3], 13)):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new,
                             pad_token_id=0,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    cases.append({"prompt": prompt, "max_new_tokens": new,
                  "generated": out[0, len(prompt):].tolist()})
with open(os.path.join(HERE, "lm", "hf_tiny_generate.json"), "w") as f:
    json.dump({"about": "greedy GPT2LMHeadModel.generate on tests/golden/lm/hf_tiny; "
                        "made by tests/golden/make_gpt_generate_golden.py",
               "cases": cases}, f, indent=1)
    f.write("\n")
print(cases)
