#!/usr/bin/python3
"""bench/ffi/run.py — the fixed fan-in output layer, pooch against PyTorch.

Forward + backward with BCE over label-CSR targets at one shape (default the
Amazon-670K head of the issue: B=128, H=4096, L=670091, K=32, 2 threads):
pooch's fused kernel (ffi_loss_grad, which gives the loss too: no [B, L]
logits, one pass over them), pooch's
unfused kernels (ffi_linear, bce_logits_csr(+_grad), ffi_grad_input,
ffi_grad_weight) and PyTorch's gather + einsum over label chunks
(bench/peers/ffi_torch.py), each its own process under /usr/bin/time -v, in
one run. Prints seconds per step, peak RSS, the ratios to PyTorch, and what
bounds the fused kernels: the FLOPs against this CPU's FMA peak and the bytes
the layer's arrays must stream against the memory bandwidth (arithmetic).

    /usr/bin/python3 bench/ffi/run.py [--build DIR] [--threads 2] [--labels N]
                                      [--steps 3] [--torch-steps 1] [--no-torch]
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER = os.path.join(ROOT, "bench", "peers", "ffi_torch.py")


def has_avx512():
    try:
        return any(l.startswith("flags") and " avx512f" in l for l in open("/proc/cpuinfo"))
    except OSError:
        return False


def timed(cmd):
    tf = "/tmp/pooch-bench-ffi.time.%d" % os.getpid()
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(["/usr/bin/time", "-v", "-o", tf] + cmd, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    rss = None
    try:
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(tf).read())
        rss = int(m.group(1)) * 1024 if m else None
        os.remove(tf)
    except OSError:
        pass
    if p.returncode != 0:
        print(p.stderr[-2000:], file=sys.stderr)
        return None
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["rss"] = rss
    return res


def cpu_ghz():
    try:
        mhz = [float(l.split(":")[1]) for l in open("/proc/cpuinfo") if l.startswith("cpu MHz")]
        return max(mhz) / 1000 if mhz else None
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("POOCH_BUILD", "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--labels", type=int, default=670091)
    ap.add_argument("--fan-in", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--torch-steps", type=int, default=1)
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args()
    build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
    exe = os.path.join(build, "bench", "pooch-bench-ffi")
    if not os.access(exe, os.X_OK):
        sys.exit(f"bench/ffi: {exe} not found; build first")
    shape = ["--batch", str(a.batch), "--hidden", str(a.hidden), "--labels", str(a.labels),
             "--fan-in", str(a.fan_in), "--threads", str(a.threads)]
    runs = {}
    for form in ("fused", "unfused"):
        runs[form] = timed([exe, "--form", form, "--steps", str(a.steps)] + shape)
    if not a.no_torch:
        runs["torch"] = timed(["/usr/bin/python3", PEER, "--steps", str(a.torch_steps)] + shape)
    B, H, L, K = a.batch, a.hidden, a.labels, a.fan_in
    print(f"bench/ffi: B={B} H={H} L={L} K={K}, {a.threads} threads, BCE; load average "
          f"{os.getloadavg()[0]:.1f}")
    print("| run | s/step | peak RSS MiB | beyond the layer's arrays MiB | torch/run (time) | "
          "torch/run (RSS) |")
    print("|---|---:|---:|---:|---:|---:|")
    t = runs.get("torch")
    for name in ("fused", "unfused", "torch"):
        r = runs.get(name)
        if not r:
            continue
        sp = r["seconds_per_step"]
        extra = r.get("extra_bytes")
        tr = f"{t['seconds_per_step'] / sp:.1f}x" if t else "-"
        mr = f"{t['rss'] / r['rss']:.2f}x" if t and r.get("rss") and t.get("rss") else "-"
        print(f"| {name} | {sp:.3f} | {r['rss'] / 2**20:.0f} | "
              f"{'-' if extra is None else f'{extra / 2**20:.1f}'} | {tr} | {mr} |")
    f = runs.get("fused")
    if f:
        # One pass: the logits, dw and dh, B*L*K multiply-adds each.
        flops = 2.0 * B * L * K * 3
        ghz = cpu_ghz()
        # Two FMA pipes a core, 16 f32 lanes each with AVX-512 (the kernels'
        # x86-64-v4 clone), 8 without; 2 flops a lane.
        lanes = 16 if has_avx512() else 8
        peak = a.threads * 2 * lanes * 2 * ghz * 1e9 if ghz else None
        idx_bytes = 2 if H <= 65536 else 4
        stream = L * K * (4 + idx_bytes) + L * K * 4 + L * 4 * 2
        sp = f["seconds_per_step"]
        print(f"fused: {flops / 1e9:.1f} GFLOP a step -> {flops / sp / 1e9:.1f} GFLOP/s"
              + (f" = {100 * flops / sp / peak:.0f}% of the {peak / 1e9:.0f} GFLOP/s FMA peak of "
                 f"{a.threads} cores at {ghz:.2f} GHz (2 FMA pipes x {lanes} lanes)" if peak else ""))
        print(f"fused: the layer's arrays streamed from memory: {stream / 2**20:.0f} MiB a step "
              f"(w and index read, dw written, once each) -> {stream / sp / 1e9:.2f} GB/s")
    print(json.dumps(runs))


if __name__ == "__main__":
    main()
