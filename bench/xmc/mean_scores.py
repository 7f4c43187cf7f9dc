#!/usr/bin/env python3
"""P@1/3/5 and PSP@1/3/5 (A=0.55, B=1.5) of predictions averaged over models.

usage: mean_scores.py DATA.txt TRAIN.txt PRED [PRED ...]

DATA.txt: the bag-of-words file the predictions are of (its labels are the
truth); TRAIN.txt: the training file (label frequencies for PSP@k); each PRED:
`pooch-run predict --model M --input DATA.txt --k L --out PRED` with L the
number of labels, so that every label's score (logit) is there. Prints each
model's figures, then those of the mean of their logits and of the mean of
their sigmoid probabilities: what an ensemble of them would score, measured
before `pooch-run train --ensemble` existed to choose its design."""
import sys

import numpy as np


def labels(path):
    rows = []
    with open(path) as f:
        _, _, n_labels = map(int, f.readline().split())
        for line in f:
            head = line.split(" ", 1)[0]
            rows.append({int(x) for x in head.split(",")} if head and ":" not in head else set())
    return rows, n_labels


def scores(path, rows, n_labels):
    s = np.full((rows, n_labels), -1e9)
    with open(path) as f:
        for i, line in enumerate(f):
            for tok in line.split():
                label, value = tok.split(":")
                s[i, int(label)] = float(value)
    return s


def main():
    truth, n_labels = labels(sys.argv[1])
    train, _ = labels(sys.argv[2])
    counts = np.zeros(n_labels)
    for r in train:
        for label in r:
            counts[label] += 1
    a, b, n = 0.55, 1.5, len(train)
    inv_prop = 1 + (np.log(n) - 1) * (b + 1) ** a * np.exp(-a * np.log(counts + b))

    def metrics(s):
        top = np.argsort(-s, axis=1)[:, :5]
        out = []
        for k in (1, 3, 5):
            out.append(100 * sum(l in truth[i] for i in range(len(truth)) for l in top[i, :k]) / (len(truth) * k))
        for k in (1, 3, 5):
            num = sum(inv_prop[l] for i in range(len(truth)) for l in top[i, :k] if l in truth[i])
            den = sum(sum(sorted((inv_prop[l] for l in truth[i]), reverse=True)[:k]) for i in range(len(truth)))
            out.append(100 * num / den)
        return " ".join(f"{v:.2f}" for v in out)

    all_scores = [scores(p, len(truth), n_labels) for p in sys.argv[3:]]
    print("                P@1   P@3   P@5 PSP@1 PSP@3 PSP@5")
    for p, s in zip(sys.argv[3:], all_scores):
        print(f"{p}: {metrics(s)}")
    if len(all_scores) > 1:
        print(f"mean of logits: {metrics(sum(all_scores) / len(all_scores))}")
        sig = [1 / (1 + np.exp(-np.clip(s, -50, 50))) for s in all_scores]
        print(f"mean of probabilities: {metrics(sum(sig) / len(sig))}")


if __name__ == "__main__":
    main()
