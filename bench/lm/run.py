#!/usr/bin/python3
"""bench/lm/run.py — pooch against PyTorch (transformers' GPT2LMHeadModel) on
a GPT-2-shaped model with random weights: training tokens per second, peak
memory, and greedy generation tokens per second (batch 1, KV cache), each
side in its own process with the same shapes and threads, one run each.

    /usr/bin/python3 bench/lm/run.py [--build DIR] [--threads 2] [--quick]
                                     [--ctx 256] [--batch 1] [--steps 3]

--quick: a 2-layer, 256-wide model (seconds instead of minutes). The peer
needs /work/venv-peers (transformers 4.38); without it only pooch runs.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER = os.path.join(ROOT, "bench", "peers", "lm_torch.py")
PEER_PY = "/work/venv-peers/bin/python"

ap = argparse.ArgumentParser()
ap.add_argument("--build", default=os.path.join(ROOT, "build"))
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--ctx", type=int, default=256)
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--gen-tokens", type=int, default=32)
ap.add_argument("--quick", action="store_true")
a = ap.parse_args()

shape = ["--layers", "12", "--heads", "12", "--width", "768", "--vocab", "50257"]
if a.quick:
    shape = ["--layers", "2", "--heads", "4", "--width", "256", "--vocab", "50257"]
common = shape + ["--ctx", str(a.ctx), "--batch", str(a.batch), "--steps", str(a.steps),
                  "--threads", str(a.threads), "--gen-tokens", str(a.gen_tokens)]
env = dict(os.environ, OMP_WAIT_POLICY="passive", OPENBLAS_THREAD_TIMEOUT="4")


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


pooch = run([os.path.join(a.build, "bench", "pooch-bench-lm")] + common)
torch = run([PEER_PY, PEER] + common) if os.path.exists(PEER_PY) else None
print(f"\nGPT-2-shaped ({' '.join(shape)}), ctx {a.ctx}, batch {a.batch}, {a.threads} threads")
print(f"{'':22}{'pooch':>12}{'torch':>12}{'pooch/torch':>13}")
# The decoder's set-up is pooch's alone (transformers generates with the
# model it trained): shown, with no ratio.
for key, label in [("train_tokens_s", "train tokens/s"), ("gen_tokens_s", "generate tokens/s"),
                   ("peak_rss_mib", "peak RSS MiB"), ("gen_setup_s", "decoder set-up s")]:
    p = pooch.get(key) if pooch else None
    t = torch.get(key) if torch else None
    ratio = f"{p / t:.2f}" if p and t else "-"
    cell = lambda v: "-" if v is None else str(round(v, 2 if key == "gen_setup_s" else 1))
    print(f"{label:22}{cell(p):>12}{cell(t):>12}{ratio:>13}")
