#!/usr/bin/python3
"""The fixed fan-in output layer's forward + backward with BCE, the idiomatic
PyTorch way (the peer of bench/ffi).

out[b, l] = sum_k h[b, index[l, k]] * w[l, k] + bias[l], over label chunks:
each chunk gathers h[:, index[chunk]] ([B, C, K]), contracts it with
w[chunk] by einsum, takes BCE with logits against its targets (summed,
divided by B, as pooch's loss) and runs backward at once, so the autograd
graph of one chunk is alive at a time; h, w and bias accumulate their
gradients over the chunks. Targets: 5 random labels per row, dense per chunk.

Needs Debian's PyTorch (python3-torch); run with /usr/bin/python3. The last
line of stdout is one JSON object.

    ffi_torch.py [--batch 128] [--hidden 4096] [--labels 670091] [--fan-in 32]
                 [--chunk 16384] [--threads 2] [--steps 1]
"""
import argparse
import json
import math
import resource
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--labels", type=int, default=670091)
    ap.add_argument("--fan-in", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=16384)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(1)
    B, H, L, K = a.batch, a.hidden, a.labels, a.fan_in
    h = torch.rand(B, H, generator=gen).mul_(2).sub_(1).clamp_(min=0).requires_grad_()
    index = torch.randint(0, H, (L, K), generator=gen)
    bound = 1.0 / math.sqrt(K)
    w = torch.empty(L, K).uniform_(-bound, bound, generator=gen).requires_grad_()
    bias = torch.full((L,), -math.log(L)).requires_grad_()
    rows = torch.arange(B).repeat_interleave(5)
    labels = torch.stack([torch.randperm(L, generator=gen)[:5] for _ in range(B)]).reshape(-1)

    def step():
        loss = 0.0
        for c0 in range(0, L, a.chunk):
            c1 = min(L, c0 + a.chunk)
            g = h[:, index[c0:c1].reshape(-1)].view(B, c1 - c0, K)
            z = torch.einsum("bck,ck->bc", g, w[c0:c1]) + bias[c0:c1]
            t = torch.zeros(B, c1 - c0)
            sel = (labels >= c0) & (labels < c1)
            t[rows[sel], labels[sel] - c0] = 1.0
            lc = F.binary_cross_entropy_with_logits(z, t, reduction="sum") / B
            lc.backward()
            loss += lc.item()
        return loss

    times = []
    for _ in range(a.steps):
        for p in (h, w, bias):
            p.grad = None
        t0 = time.time()
        loss = step()
        times.append(time.time() - t0)
    times.sort()
    print(json.dumps({"peer": "torch", "torch": torch.__version__, "batch": B, "hidden": H,
                      "labels": L, "fan_in": K, "chunk": a.chunk, "threads": a.threads,
                      "steps": a.steps, "seconds_per_step": round(times[len(times) // 2], 4),
                      "loss": loss,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


if __name__ == "__main__":
    main()
