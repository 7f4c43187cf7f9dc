#!/usr/bin/python3
"""bench/cnn/run.py — pooch against PyTorch on ResNet-18 and ResNet-50 training.

For each depth: random uint8 images (a fixed seed, N×H×W×3) and class ids are
written once; `pooch-run train --spec resnet` and the PyTorch peer
(bench/peers/cnn_torch.py: the same network, plain torch.nn) then train the
same steps with SGD (momentum 0.9) and the same threads, each as its own
process under `/usr/bin/time -v`. Prints images/s of the training loop
(pooch: every step, its first included: planning and oneDNN's primitives
come before it, at session creation; PyTorch: after one untimed warm-up step,
which creates its primitives), peak RSS of the whole process, and the ratios
pooch/torch.

    /usr/bin/python3 bench/cnn/run.py [--build DIR] [--threads 2] [--size 64]
                                      [--batch 8] [--steps 6] [--depth 18 50]
                                      [--json FILE] [--no-torch]

Sized to run in a few minutes on 2 cores: small images and batches (the
ratios at ImageNet size differ; see docs/BENCHMARKS.md). Needs /usr/bin/time
(Debian package `time`), numpy, and for the peer Debian's PyTorch.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER = os.path.join(ROOT, "bench", "peers", "cnn_torch.py")


def timed(cmd, env=None):
    """Runs cmd under GNU time -v; returns (stdout, peak RSS bytes)."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        p = subprocess.run(["/usr/bin/time", "-v", "-o", tf.name] + cmd, capture_output=True,
                           text=True, env=env)
        if p.returncode != 0:
            sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(tf.name).read())
        return p.stdout, int(m.group(1)) * 1024 if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--depth", type=int, nargs="+", default=[18, 50])
    ap.add_argument("--json")
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args()
    run = os.path.join(a.build, "apps", "pooch-run")
    with tempfile.TemporaryDirectory(prefix="pooch-bench-cnn.") as work:
        bench(a, run, work)


def bench(a, run, work):
    rng = np.random.default_rng(1)
    n = a.batch * a.steps
    xp, yp = os.path.join(work, "x.npy"), os.path.join(work, "y.npy")
    np.save(xp, rng.integers(0, 256, (n, a.size, a.size, 3), dtype=np.uint8))
    np.save(yp, rng.integers(0, 10, n, dtype=np.int32))
    # Passive OpenMP waiting for both: pooch-run sets it for itself, and on a
    # loaded machine PyTorch's spinning threads would otherwise lose most of
    # their time to the spinning itself.
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OMP_WAIT_POLICY="passive")
    rows = []
    for depth in a.depth:
        spec = os.path.join(work, f"resnet{depth}.json")
        with open(spec, "w") as f:
            json.dump({"family": "resnet", "depth": depth}, f)
        out, rss = timed([run, "train", "--data", xp, "--targets", yp, "--spec", spec,
                          "--epochs", "1", "--batch", str(a.batch), "--valid-fraction", "0",
                          "--optimizer", "sgd", "--lr", "0.01", "--threads", str(a.threads),
                          "--device", "cpu", "--out", os.path.join(work, "m.pooch"), "--json"],
                         env)
        res = json.loads(out.strip().splitlines()[-1])
        row = {"depth": depth, "image": a.size, "batch": a.batch, "steps": res["steps"],
               "pooch_images_per_s": res["steps"] * a.batch / res["seconds"],
               "pooch_rss_mib": rss / 2**20}
        if not a.no_torch:
            out, rss = timed(["/usr/bin/python3", PEER, "--depth", str(depth), "--x", xp, "--y",
                              yp, "--batch", str(a.batch), "--steps", str(a.steps), "--threads",
                              str(a.threads)], env)
            t = json.loads(out.strip().splitlines()[-1])
            row.update(torch_images_per_s=t["images_per_s"], torch_rss_mib=rss / 2**20)
            row["speed_ratio"] = row["pooch_images_per_s"] / row["torch_images_per_s"]
            row["rss_ratio"] = row["pooch_rss_mib"] / row["torch_rss_mib"]
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    load = os.getloadavg()[0]
    print(f"ResNet training on the CPU, {a.size}x{a.size} images, batch {a.batch}, "
          f"{a.steps} steps, {a.threads} threads (SGD, momentum 0.9); load average {load:.1f} "
          f"on {os.cpu_count()} CPUs at the end")
    print("| model | pooch img/s | torch img/s | speed pooch/torch | pooch peak RSS MiB | "
          "torch peak RSS MiB | RSS pooch/torch |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| ResNet-{r['depth']} | {r['pooch_images_per_s']:.1f} | "
              f"{r.get('torch_images_per_s', float('nan')):.1f} | "
              f"{r.get('speed_ratio', float('nan')):.2f} | {r['pooch_rss_mib']:.0f} | "
              f"{r.get('torch_rss_mib', float('nan')):.0f} | {r.get('rss_ratio', float('nan')):.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
