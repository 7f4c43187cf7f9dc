#!/usr/bin/env python3
"""PECOS XR-Linear on a bag-of-words XMC set (the linear-tree peer).

Default XR-Linear, as PECOS' quick start trains it: PIFA label embeddings,
hierarchical k-means label tree (Indexer.gen defaults), one-vs-all linear
rankers per tree node (XLinearModel.train defaults), beam search at predict.
Training time counts the label embedding, the tree and the rankers, not
reading the files. P@k and PSP@k (Jain et al. 2016 propensities with the
given A, B; PSP as pyxclib computes it: a ratio of sums over the test set)
for k = 1, 3, 5.

Needs libpecos (pip) and scipy: run with /work/venv-peers/bin/python. The
last line of stdout is one JSON object.

    xmc_pecos.py --train tr.txt --test va.txt --threads 2 [--propensity 0.55,1.5]
"""

import argparse
import json
import math
import resource
import time

import numpy as np
import scipy.sparse as sp


def read_bow(path):
    """Extreme Classification Repository bag-of-words file -> (X csr f32, Y csr f32)."""
    with open(path) as f:
        n, nf, nl = (int(x) for x in f.readline().split())
        xi, xj, xv, yi, yj = [], [], [], [], []
        r = 0
        for line in f:
            line = line.rstrip("\n")
            if not line and r >= n:
                continue
            head, _, rest = line.partition(" ")
            if ":" in head:
                head, rest = "", line
            for lab in head.split(","):
                if lab:
                    yi.append(r)
                    yj.append(int(lab))
            for tok in rest.split():
                k, v = tok.split(":")
                xi.append(r)
                xj.append(int(k))
                xv.append(float(v))
            r += 1
    if r != n:
        raise SystemExit(f"{path}: header says {n} rows, the file holds {r}")
    X = sp.csr_matrix((np.array(xv, np.float32), (xi, xj)), shape=(n, nf), dtype=np.float32)
    Y = sp.csr_matrix((np.ones(len(yi), np.float32), (yi, yj)), shape=(n, nl), dtype=np.float32)
    X.sum_duplicates()
    Y.sum_duplicates()
    Y.data[:] = 1
    return X, Y


def inverse_propensity(Y, a, b):
    n = Y.shape[0]
    counts = np.asarray(Y.sum(axis=0)).ravel()
    c = (math.log(n) - 1.0) * (b + 1.0) ** a
    return 1.0 + c * (counts + b) ** (-a)


def metrics(Ytrue, top, inv_p, ks=(1, 3, 5)):
    """P@k (mean over rows) and PSP@k (pyxclib: ratio of sums) from top labels [rows, >=5]."""
    out = {}
    rows = Ytrue.shape[0]
    for k in ks:
        hits = 0.0
        num = den = 0.0
        for r in range(rows):
            truth = Ytrue.indices[Ytrue.indptr[r]:Ytrue.indptr[r + 1]]
            ts = set(truth.tolist())
            pred = top[r][:k]
            hits += sum(1 for p in pred if p in ts)
            num += sum(inv_p[p] for p in pred if p in ts)
            den += float(np.sort(inv_p[truth])[::-1][:k].sum())
        out[f"P@{k}"] = 100.0 * hits / (rows * k)
        out[f"PSP@{k}"] = 100.0 * num / den if den > 0 else 0.0
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--propensity", default="0.55,1.5")
    a = ap.parse_args()
    from pecos.xmc import Indexer, LabelEmbeddingFactory
    from pecos.xmc.xlinear.model import XLinearModel

    X, Y = read_bow(a.train)
    Xt, Yt = read_bow(a.test)
    t0 = time.time()
    feat = LabelEmbeddingFactory.create(Y, X, method="pifa")
    chain = Indexer.gen(feat, threads=a.threads)
    model = XLinearModel.train(X, Y, C=chain, threads=a.threads)
    train_s = time.time() - t0
    t0 = time.time()
    P = model.predict(Xt, only_topk=5, threads=a.threads).tocsr()
    predict_s = time.time() - t0
    top = []
    for r in range(P.shape[0]):
        s, e = P.indptr[r], P.indptr[r + 1]
        order = np.argsort(-P.data[s:e], kind="stable")
        top.append(P.indices[s:e][order].tolist())
    pa, pb = (float(x) for x in a.propensity.split(","))
    res = {"peer": "pecos-xr-linear", "train_seconds": round(train_s, 3),
           "predict_seconds": round(predict_s, 3),
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    res.update({k: round(v, 2) for k, v in metrics(Yt, top, inverse_propensity(Y, pa, pb)).items()})
    print(json.dumps(res))


if __name__ == "__main__":
    main()
