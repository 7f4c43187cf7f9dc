#!/usr/bin/python3
"""bench/xmc/split_bow.py — hold a validation part out of a bag-of-words training file.

    split_bow.py TRAIN.txt --val-rows 4229 --seed 11 --out-train tr.txt --out-val va.txt

Rows are drawn at random (a fixed seed, so every run and every peer sees the
same split); both outputs keep the file's header form ("rows features labels")
and the rows' original order. Tuning reads only these two files: the data
set's test file stays out of every choice.
"""
import argparse
import random


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train")
    ap.add_argument("--val-rows", type=int, default=4229)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out-train", required=True)
    ap.add_argument("--out-val", required=True)
    a = ap.parse_args()
    with open(a.train) as f:
        header = f.readline().split()
        rows = f.readlines()
    n, feats, labels = int(header[0]), header[1], header[2]
    if n != len(rows):
        raise SystemExit(f"{a.train}: header says {n} rows, the file holds {len(rows)}")
    if not 0 < a.val_rows < n:
        raise SystemExit(f"--val-rows {a.val_rows}: must be between 1 and {n - 1}")
    val = set(random.Random(a.seed).sample(range(n), a.val_rows))
    for path, keep in ((a.out_train, False), (a.out_val, True)):
        part = [r for i, r in enumerate(rows) if (i in val) == keep]
        with open(path, "w") as f:
            f.write(f"{len(part)} {feats} {labels}\n")
            f.writelines(part)


if __name__ == "__main__":
    main()
