#!/usr/bin/python3
"""The pooch XMC model, trained the idiomatic PyTorch way (the benchmark peer).

Model (the same as `pooch-run train --hidden H --fan-in K`):
  sparse bag-of-words input -> EmbeddingBag(F, H, mode='sum') with
  per_sample_weights + bias -> ReLU -> fixed fan-in head (label l reads the
  K distinct hidden units index[l, :], weight[L, K], bias[L]) -> loss summed
  over labels, averaged over rows -> torch.optim.Adam.

Initialisation follows pooch (runtime/train/xmc_model.cpp): input weights
uniform +-1/sqrt(8), input bias 0; head weights uniform +-1/sqrt(K); head
bias -log(L) for BCE and squared hinge, 0 for softmax. The random streams
differ from pooch's (Philox), so runs agree in distribution, not bitwise.

Data order: a fresh permutation of the training rows every epoch (as pooch's
trainer does); the last batch may be short. After each epoch P@1/3/5 on the
test set from the top-5 logits. The epoch's seconds include that evaluation,
as pooch's do; `train_seconds` and `eval_seconds` split it.

Needs Debian's PyTorch: apt-get install python3-torch python3-numpy, and run
with /usr/bin/python3. The last line of stdout is one JSON object.

    /usr/bin/python3 bench/peers/xmc_torch.py --data DIR --hidden 1024 \
        --fan-in 32 --loss bce --epochs 3 --batch 64 --lr 1e-3 --threads 2
"""

import argparse
import json
import math
import resource
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_bow(path):
    """Extreme Classification Repository bag-of-words file.

    Returns (rows, features, labels, offsets[int64 rows], col[int64],
    val[float32], row_ptr[int64 rows+1], label lists)."""
    with open(path, "r") as f:
        header = f.readline().split()
        n, nf, nl = int(header[0]), int(header[1]), int(header[2])
        cols, vals, row_ptr, labels = [], [], [0], []
        for line in f:
            line = line.rstrip("\n")
            if not line and len(labels) >= n:
                continue
            # The label list may be empty: the line then starts with a space
            # or directly with a feature "f:v".
            head, _, rest = line.partition(" ")
            if ":" in head:
                rest = line
                head = ""
            labels.append([int(x) for x in head.split(",") if x])
            if rest.strip():
                a = np.array(rest.replace(":", " ").split(), dtype=np.float64)
                cols.append(a[0::2].astype(np.int64))
                vals.append(a[1::2].astype(np.float32))
                row_ptr.append(row_ptr[-1] + len(cols[-1]))
            else:
                row_ptr.append(row_ptr[-1])
    if len(labels) != n:
        sys.exit(f"{path}: header says {n} rows, found {len(labels)}")
    col = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    val = np.concatenate(vals) if vals else np.zeros(0, np.float32)
    return {
        "rows": n, "features": nf, "labels": nl,
        "col": torch.from_numpy(col), "val": torch.from_numpy(val),
        "row_ptr": torch.tensor(row_ptr, dtype=torch.int64),
        "label": labels,
    }


class FixedFanIn(nn.Module):
    """out[b, l] = sum_k h[b, index[l, k]] * weight[l, k] + bias[l]."""

    def __init__(self, inputs, labels, fan_in, bias0, gen):
        super().__init__()
        # K distinct random inputs per label (sorted, as pooch stores them).
        idx = torch.stack([torch.randperm(inputs, generator=gen)[:fan_in].sort().values
                           for _ in range(labels)]) if fan_in < inputs else \
            torch.arange(inputs).repeat(labels, 1)
        self.register_buffer("index", idx.contiguous())
        self.register_buffer("flat_index", idx.reshape(-1).contiguous())
        bound = 1.0 / math.sqrt(fan_in)
        self.weight = nn.Parameter(torch.empty(labels, fan_in).uniform_(-bound, bound, generator=gen))
        self.bias = nn.Parameter(torch.full((labels,), bias0))

    def forward(self, h):
        b = h.shape[0]
        g = torch.index_select(h, 1, self.flat_index).view(b, *self.index.shape)  # [B, L, K]
        return (g * self.weight).sum(-1) + self.bias


class XmcModel(nn.Module):
    def __init__(self, features, hidden, labels, fan_in, bias0, gen):
        super().__init__()
        self.emb = nn.EmbeddingBag(features, hidden, mode="sum")
        with torch.no_grad():
            self.emb.weight.uniform_(-1.0 / math.sqrt(8.0), 1.0 / math.sqrt(8.0), generator=gen)
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.head = FixedFanIn(hidden, labels, fan_in, bias0, gen)

    def forward(self, col, offsets, val):
        h = torch.relu(self.emb(col, offsets, per_sample_weights=val) + self.bias)
        return self.head(h)


def batch(d, rows, labels_total, with_targets):
    rp = d["row_ptr"]
    starts, ends = rp[rows], rp[rows + 1]
    lens = ends - starts
    offsets = torch.zeros(len(rows), dtype=torch.int64)
    if len(rows) > 1:
        offsets[1:] = torch.cumsum(lens, 0)[:-1]
    sel = torch.cat([torch.arange(s, e) for s, e in zip(starts.tolist(), ends.tolist())]) \
        if len(rows) else torch.zeros(0, dtype=torch.int64)
    col, val = d["col"][sel], d["val"][sel]
    if not with_targets:
        return col, offsets, val, None
    t = torch.zeros(len(rows), labels_total)
    for r, i in enumerate(rows.tolist()):
        ls = d["label"][i]
        if ls:
            t[r, ls] = 1.0
    return col, offsets, val, t


def loss_fn(kind, logits, t):
    b = logits.shape[0]
    if kind == "bce":
        return F.binary_cross_entropy_with_logits(logits, t, reduction="sum") / b
    if kind == "squared-hinge":
        return torch.clamp(1.0 - (2.0 * t - 1.0) * logits, min=0.0).pow(2).sum() / b
    # softmax: -sum_l t_l log softmax(x)_l, targets 0/1 (as pooch's softmax_xent)
    return -(t * F.log_softmax(logits, dim=1)).sum() / b


@torch.no_grad()
def evaluate(model, d, batch_size, labels_total):
    model.eval()
    hits = np.zeros(5)
    n = d["rows"]
    for first in range(0, n, batch_size):
        rows = torch.arange(first, min(n, first + batch_size))
        col, off, val, _ = batch(d, rows, labels_total, False)
        top = torch.topk(model(col, off, val), 5, dim=1).indices.tolist()
        for r, i in enumerate(rows.tolist()):
            truth = set(d["label"][i])
            hit = [1.0 if l in truth else 0.0 for l in top[r]]
            hits += np.cumsum(hit)
    model.train()
    p = hits / max(n, 1)
    return {"p1": p[0] / 1.0, "p3": p[2] / 3.0, "p5": p[4] / 5.0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="directory holding train.txt and test.txt")
    ap.add_argument("--train")
    ap.add_argument("--test")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--fan-in", type=int, default=32)
    ap.add_argument("--loss", choices=["bce", "squared-hinge", "softmax"], default="bce")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=0, help="0: all cores")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    train_path = a.train or (a.data + "/train.txt")
    test_path = a.test or (a.data + "/test.txt")

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)

    t0 = time.perf_counter()
    tr = read_bow(train_path)
    te = read_bow(test_path)
    load_s = time.perf_counter() - t0
    nf = max(tr["features"], te["features"])
    nl = max(tr["labels"], te["labels"])
    if not a.quiet:
        print(f"train: {train_path}: {tr['rows']} rows, {nf} features, {nl} labels; "
              f"test {te['rows']} rows ({load_s:.1f} s)", file=sys.stderr)

    bias0 = 0.0 if a.loss == "softmax" else -math.log(nl)
    model = XmcModel(nf, a.hidden, nl, min(a.fan_in, a.hidden), bias0, gen)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8)

    epochs = []
    for ep in range(a.epochs):
        t_ep = time.perf_counter()
        order = torch.randperm(tr["rows"], generator=gen)
        loss_sum, steps = 0.0, 0
        for first in range(0, tr["rows"], a.batch):
            rows = order[first:first + a.batch]
            col, off, val, t = batch(tr, rows, nl, True)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(a.loss, model(col, off, val), t)
            loss.backward()
            opt.step()
            loss_sum += loss.item()
            steps += 1
        t_train = time.perf_counter() - t_ep
        m = evaluate(model, te, a.batch, nl)
        sec = time.perf_counter() - t_ep
        rec = {"epoch": ep + 1, "loss": loss_sum / max(steps, 1), "seconds": sec,
               "train_seconds": t_train, "eval_seconds": sec - t_train, **m}
        epochs.append(rec)
        if not a.quiet:
            print(f"epoch {ep + 1}/{a.epochs}  loss {rec['loss']:.5f}  P@1/3/5 "
                  f"{100 * m['p1']:.2f} {100 * m['p3']:.2f} {100 * m['p5']:.2f}  "
                  f"{sec:.1f} s (train {t_train:.1f} s)", file=sys.stderr)

    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    last = epochs[-1] if epochs else {"p1": 0.0, "p3": 0.0, "p5": 0.0}
    out = {
        "peer": "pytorch", "torch": torch.__version__, "threads": torch.get_num_threads(),
        "hidden": a.hidden, "fan_in": a.fan_in, "loss": a.loss, "batch": a.batch, "lr": a.lr,
        "train_rows": tr["rows"], "test_rows": te["rows"], "features": nf, "labels": nl,
        "load_seconds": load_s, "epochs": epochs,
        "seconds_per_epoch": sum(e["seconds"] for e in epochs) / max(len(epochs), 1),
        "peak_rss_bytes": rss_kib * 1024,
        "p1": last["p1"], "p3": last["p3"], "p5": last["p5"],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
