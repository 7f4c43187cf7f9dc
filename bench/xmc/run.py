#!/usr/bin/python3
"""bench/xmc/run.py — pooch against PyTorch on the XMC model, side by side.

For each configuration: `pooch-run synth` writes a synthetic set shaped like a
known data set (fixed seed); then `pooch-run train` and the PyTorch peer
(bench/peers/xmc_torch.py) train the same model (sparse input -> linear(H) +
ReLU -> fixed fan-in head, Adam, constant learning rate, shuffled epochs) with
the same hyper-parameters and threads, each as its own process under
`/usr/bin/time -v`. Prints a table: seconds per epoch (training plus the test
evaluation that closes each epoch), process CPU seconds, peak RSS, P@1/3/5 on
the test set after the last epoch, and the ratios pooch/torch.

    /usr/bin/python3 bench/xmc/run.py [--build DIR] [--threads 2] [--quick]
                                      [--config NAME ...] [--work DIR] [--json FILE]
                                      [--omp-wait-policy passive] [--no-torch]

PECOS XR-Linear (bench/peers/xmc_pecos.py, default settings, the same
threads) runs beside them on every set, with its training time, P@k and
PSP@k; it needs a Python with libpecos (--pecos-python, default
$POOCH_PECOS_PYTHON, else $BUILD/venv-peers/bin/python, which ./pooch.sh
bench creates). --debtags adds the real Debtags set (pooch-run train with
its defaults for bag-of-words data, against PECOS).

--quick runs only the first configuration for one epoch. Needs
/usr/bin/time (Debian package `time`) and, for the peer, Debian's PyTorch
(`python3-torch python3-numpy`); without PyTorch the pooch side still runs.
Run it with /usr/bin/python3 (Debian's), not a pyenv or venv python.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER = os.path.join(ROOT, "bench", "peers", "xmc_torch.py")
PECOS_PEER = os.path.join(ROOT, "bench", "peers", "xmc_pecos.py")
PYTHON = "/usr/bin/python3"
# The Debtags set (../shared/data beside the repository: the archive and the
# script that built it); extracted into the work directory when first needed.
DEBTAGS_ARCHIVE = os.path.join(os.path.dirname(ROOT), "shared", "data", "debtags-xmc.tar.zst")

# name, preset, scale, hyper-parameters. Sized so that the whole run stays
# under ~10 minutes on 2 cores (the PyTorch side is the slow one).
CONFIGS = [
    {"name": "eurlex4k", "preset": "EURLex-4K", "scale": 1.0, "seed": 1,
     "hidden": 1024, "fan_in": 32, "loss": "bce", "epochs": 2, "batch": 128, "lr": 2e-3},
    {"name": "wiki10-31k-0.25", "preset": "Wiki10-31K", "scale": 0.25, "seed": 1,
     "hidden": 512, "fan_in": 32, "loss": "bce", "epochs": 2, "batch": 128, "lr": 2e-3},
]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def parse_time_v(path):
    """Peak RSS (bytes), user+sys seconds and wall seconds from GNU time -v."""
    out = {"rss_bytes": None, "cpu_s": None, "wall_s": None}
    try:
        text = open(path).read()
    except OSError:
        return out
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if m:
        out["rss_bytes"] = int(m.group(1)) * 1024
    u = re.search(r"User time \(seconds\): ([\d.]+)", text)
    s = re.search(r"System time \(seconds\): ([\d.]+)", text)
    if u and s:
        out["cpu_s"] = float(u.group(1)) + float(s.group(1))
    w = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    if w:
        secs = 0.0
        for part in w.group(1).split(":"):
            secs = secs * 60 + float(part)
        out["wall_s"] = secs
    return out


def timed(cmd, tag, work, env=None):
    """Run cmd under /usr/bin/time -v; return (last JSON line or None, time stats, rc)."""
    tfile = os.path.join(work, tag + ".time")
    lfile = os.path.join(work, tag + ".log")
    log("$ " + " ".join(cmd))
    with open(lfile, "w") as lf:
        p = subprocess.run(["/usr/bin/time", "-v", "-o", tfile] + cmd,
                           stdout=subprocess.PIPE, stderr=lf, text=True, env=env)
    with open(lfile, "a") as lf:
        lf.write(p.stdout)
    res = None
    for line in reversed(p.stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                res = json.loads(line)
            except ValueError:
                pass
            break
    if p.returncode != 0:
        log(f"  exit status {p.returncode}; last lines of {lfile}:")
        with open(lfile) as lf:
            for line in lf.read().splitlines()[-8:]:
                log("    " + line[:400])
    return res, parse_time_v(tfile), p.returncode


def have_torch():
    try:
        subprocess.run([PYTHON, "-c", "import torch, numpy"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return True
    except (OSError, subprocess.CalledProcessError):
        return False


def baseline_rss(cmd, work, tag):
    """Peak RSS of a process that only starts (loads its libraries)."""
    _, t, _ = timed(cmd, tag, work)
    return t["rss_bytes"]


def have_pecos(python):
    try:
        subprocess.run([python, "-c", "import pecos, scipy"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return True
    except (OSError, subprocess.CalledProcessError):
        return False


def run_pecos(python, train, test, threads, tag, work, env):
    """PECOS XR-Linear on a train/test pair: its JSON (P@k and PSP@k in %) and time stats."""
    pj, pt, prc = timed([python, PECOS_PEER, "--train", train, "--test", test,
                         "--threads", str(threads)], tag, work, env)
    row = {"rc": prc, **pt}
    if pj:
        row.update({"train_s": pj["train_seconds"],
                    **{k.lower().replace("@", ""): pj[k] / 100 for k in
                       ("P@1", "P@3", "P@5", "PSP@1", "PSP@3", "PSP@5")}})
    return row


def debtags_data(work):
    """The Debtags train/test files, extracted from the shared archive once."""
    data = os.path.join(work, "debtags-xmc")
    if not os.path.exists(os.path.join(data, "train.txt")):
        if not os.path.exists(DEBTAGS_ARCHIVE):
            return None
        subprocess.run(["tar", "--zstd", "-xf", DEBTAGS_ARCHIVE, "-C", work], check=True)
    return data


def run_debtags(pooch_run, threads, work, pecos_python, env):
    """pooch-run train with its defaults for bag-of-words data against PECOS, on Debtags."""
    data = debtags_data(work)
    if data is None:
        log(f"bench/xmc: {DEBTAGS_ARCHIVE} not found; Debtags skipped")
        return None
    with open(os.path.join(data, "train.txt")) as f:
        n, nf, nl = (int(x) for x in f.readline().split())
    row = {"config": "debtags", "preset": "Debtags", "scale": 1.0, "rows": n, "features": nf,
           "labels": nl, "hidden": "default", "fan_in": "-", "loss": "default",
           "batch": "default", "lr": "default", "epochs": "default"}
    model = os.path.join(work, "debtags.pooch")
    pj, pt, prc = timed([pooch_run, "train", "--data", data, "--threads", str(threads),
                         "--device", "cpu", "--out", model, "--json"], "debtags.pooch-run",
                        work, env)
    row["pooch"] = {"rc": prc, **pt}
    if pj and pj.get("ok"):
        eps = pj.get("epochs", [])
        ev = pj.get("final") or (eps[-1]["eval"] if eps else {})
        prec, psp = ev.get("precision", []), ev.get("psp", [])
        # An ensemble (the default here) reports its members' epochs under
        # "members" and its training's wall clock as "seconds" (members that
        # train at once count once).
        members = pj.get("members", [])
        train_s = pj["seconds"] if members else sum(e["seconds"] for e in eps)
        n_epochs = len(members[0].get("epochs", [])) if members else len(eps)
        row["pooch"].update({
            "s_epoch": train_s / max(n_epochs, 1),
            "train_s": train_s,
            **{f"p{k}": prec[k - 1] for k in (1, 3, 5) if len(prec) >= k},
            **{f"psp{k}": psp[k - 1] for k in (1, 3, 5) if len(psp) >= k},
        })
    for f in (model, model + ".ckpt"):
        if os.path.exists(f):
            os.remove(f)
    if pecos_python:
        row["pecos"] = run_pecos(pecos_python, os.path.join(data, "train.txt"),
                                 os.path.join(data, "test.txt"), threads, "debtags.pecos", work,
                                 env)
    return row


def run_config(c, pooch_run, threads, work, torch_ok, epochs=None, env=None, pecos_python=None):
    epochs = epochs or c["epochs"]
    data = os.path.join(work, f"{c['preset']}-{c['scale']:g}-s{c['seed']}")
    if not (os.path.exists(os.path.join(data, "train.txt"))
            and os.path.exists(os.path.join(data, "test.txt"))):
        log(f"synth {c['preset']} scale {c['scale']:g} seed {c['seed']} -> {data}")
        subprocess.run([pooch_run, "synth", "--preset", c["preset"], "--scale", str(c["scale"]),
                        "--seed", str(c["seed"]), "--out", data],
                       check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(data, "train.txt")) as f:
        n, nf, nl = (int(x) for x in f.readline().split())
    common = ["--hidden", str(c["hidden"]), "--fan-in", str(c["fan_in"]), "--loss", c["loss"],
              "--epochs", str(epochs), "--batch", str(c["batch"]), "--lr", repr(c["lr"]),
              "--threads", str(threads), "--seed", str(c["seed"])]
    row = {"config": c["name"], "preset": c["preset"], "scale": c["scale"], "rows": n,
           "features": nf, "labels": nl, **{k: c[k] for k in ("hidden", "fan_in", "loss", "batch",
                                                              "lr")}, "epochs": epochs}

    model = os.path.join(work, c["name"] + ".pooch")
    pj, pt, prc = timed([pooch_run, "train", "--data", data] + common +
                        ["--plateau-patience", "0", "--early-stop", "0", "--device", "cpu",
                         "--out", model, "--json"], c["name"] + ".pooch-run", work, env)
    row["pooch"] = {"rc": prc, **pt}
    if pj and pj.get("ok"):
        eps = pj.get("epochs", [])
        prec = (pj.get("final") or (eps[-1]["eval"] if eps else {})).get("precision", [])
        row["pooch"].update({
            "s_epoch": sum(e["seconds"] for e in eps) / max(len(eps), 1),
            "train_s": sum(e["seconds"] for e in eps),
            "epoch_seconds": [e["seconds"] for e in eps],
            "loss": eps[-1]["loss"] if eps else None,
            "p1": prec[0] if len(prec) > 0 else None,
            "p3": prec[2] if len(prec) > 2 else None,
            "p5": prec[4] if len(prec) > 4 else None,
            "arena_bytes": (pj.get("memory") or {}).get("arena_bytes"),
        })
        psp = (pj.get("final") or (eps[-1]["eval"] if eps else {})).get("psp", [])
        row["pooch"].update({f"psp{k}": psp[k - 1] for k in (1, 3, 5) if len(psp) >= k})
    elif pj:
        row["pooch"]["error"] = pj.get("error")
    for f in (model, model + ".ckpt"):
        if os.path.exists(f):
            os.remove(f)

    if torch_ok:
        tj, tt, trc = timed([PYTHON, PEER, "--data", data] + common,
                            c["name"] + ".torch", work, env)
        row["torch"] = {"rc": trc, **tt}
        if tj:
            row["torch"].update({
                "s_epoch": tj["seconds_per_epoch"],
                "epoch_seconds": [e["seconds"] for e in tj["epochs"]],
                "train_seconds": [e["train_seconds"] for e in tj["epochs"]],
                "loss": tj["epochs"][-1]["loss"] if tj["epochs"] else None,
                "p1": tj["p1"], "p3": tj["p3"], "p5": tj["p5"],
                "version": tj["torch"],
            })
    if pecos_python:
        row["pecos"] = run_pecos(pecos_python, os.path.join(data, "train.txt"),
                                 os.path.join(data, "test.txt"), threads, c["name"] + ".pecos",
                                 work, env)
    return row


def fmt(v, kind):
    if v is None:
        return "-"
    if kind == "s":
        return f"{v:.1f}"
    if kind == "mib":
        return f"{v / 2**20:.0f}"
    if kind == "p":
        return f"{100 * v:.2f}"
    if kind == "x":
        return f"{v:.2f}x"
    return str(v)


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def table(rows, base):
    cols = [("s/epoch", "s_epoch", "s"), ("train s", "train_s", "s"), ("CPU s", "cpu_s", "s"),
            ("wall s", "wall_s", "s"), ("peak RSS MiB", "rss_bytes", "mib"), ("P@1", "p1", "p"),
            ("P@3", "p3", "p"), ("P@5", "p5", "p"), ("PSP@1", "psp1", "p"),
            ("PSP@3", "psp3", "p"), ("PSP@5", "psp5", "p")]
    lines = []
    head = f"| {'config':<34} | {'run':<12} | " + " | ".join(f"{c[0]:>12}" for c in cols) + " |"
    lines.append(head)
    lines.append(f"|{'-' * 36}|{'-' * 14}|" + "|".join("-" * 13 + ":" for _ in cols) + "|")
    for r in rows:
        desc = (f"{r['preset']} x{r['scale']:g} H{r['hidden']} K{r['fan_in']} "
                f"B{r['batch']} E{r['epochs']}")
        p, t = r.get("pooch", {}), r.get("torch")
        if r["config"] == "debtags":
            desc = f"Debtags (real) pooch defaults"
        lines.append(f"| {desc:<34} | {'pooch':<12} | " +
                     " | ".join(f"{fmt(p.get(k), kind):>12}" for _, k, kind in cols) + " |")
        e = r.get("pecos")
        if e is not None:
            lines.append(f"| {'':<34} | {'pecos':<12} | " +
                         " | ".join(f"{fmt(e.get(k), kind):>12}" for _, k, kind in cols) + " |")
            lines.append(f"| {'':<34} | {'pooch/pecos':<12} | " +
                         " | ".join(f"{fmt(ratio(p.get(k), e.get(k)), 'x'):>12}"
                                    for _, k, _ in cols) + " |")
        if t is not None:
            lines.append(f"| {'':<34} | {'torch':<12} | " +
                         " | ".join(f"{fmt(t.get(k), kind):>12}" for _, k, kind in cols) + " |")
            lines.append(f"| {'':<34} | {'pooch/torch':<12} | " +
                         " | ".join(f"{fmt(ratio(p.get(k), t.get(k)), 'x'):>12}"
                                    for _, k, _ in cols) + " |")
    if base:
        lines.append("")
        lines.append("Startup RSS (a process that only loads its libraries): " +
                     ", ".join(f"{k} {fmt(v, 'mib')} MiB" for k, v in base.items()))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("POOCH_BUILD", "build"),
                    help="Meson build directory holding apps/pooch-run (default $POOCH_BUILD "
                         "or build)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="first configuration, one epoch")
    ap.add_argument("--config", action="append", choices=[c["name"] for c in CONFIGS],
                    help="run only this configuration (repeatable)")
    ap.add_argument("--work", help="directory for data sets and logs "
                                   "(default BUILD/bench-xmc; data sets are reused)")
    ap.add_argument("--json", help="also write all results here")
    ap.add_argument("--no-torch", action="store_true", help="run no PyTorch peer")
    ap.add_argument("--pecos-python", default=os.environ.get("POOCH_PECOS_PYTHON"),
                    help="a Python with libpecos for the PECOS XR-Linear peer (default "
                         "$POOCH_PECOS_PYTHON, else BUILD/venv-peers/bin/python)")
    ap.add_argument("--no-pecos", action="store_true", help="run no PECOS peer")
    ap.add_argument("--debtags", action="store_true",
                    help="also the real Debtags set (../shared/data/debtags-xmc.tar.zst)")
    ap.add_argument("--omp-wait-policy", choices=["passive", "active"],
                    help="set OMP_WAIT_POLICY for both sides (both use libgomp); default: "
                         "inherited. On a machine shared with other work, passive avoids "
                         "threads spinning at barriers while the other thread is descheduled")
    a = ap.parse_args()

    build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
    pooch_run = os.path.join(build, "apps", "pooch-run")
    if not os.access(pooch_run, os.X_OK):
        sys.exit(f"bench/xmc: {pooch_run} not found; build first (./pooch.sh bench, or "
                 f"ninja -C {a.build})")
    if not os.access("/usr/bin/time", os.X_OK):
        sys.exit("bench/xmc: /usr/bin/time is missing; apt-get install time")
    work = a.work or os.path.join(build, "bench-xmc")
    os.makedirs(work, exist_ok=True)
    torch_ok = not a.no_torch and have_torch()
    if not torch_ok and not a.no_torch:
        log(f"bench/xmc: {PYTHON} cannot import torch and numpy; running pooch only "
            "(apt-get install python3-torch python3-numpy)")

    pecos_python = None
    if not a.no_pecos:
        cand = a.pecos_python or os.path.join(build, "venv-peers", "bin", "python")
        if have_pecos(cand):
            pecos_python = cand
        else:
            log(f"bench/xmc: {cand} cannot import pecos and scipy; no PECOS peer "
                "(pip install libpecos, or --pecos-python)")

    configs = [c for c in CONFIGS if not a.config or c["name"] in a.config]
    if a.quick:
        configs = configs[:1]
    env = dict(os.environ)
    if a.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = a.omp_wait_policy
    policy = env.get("OMP_WAIT_POLICY", "unset")
    load0 = os.getloadavg()[0]
    t0 = time.time()
    base = {"pooch-run --version": baseline_rss([pooch_run, "--version"], work, "base.pooch")}
    if torch_ok:
        base["python3 -c 'import torch'"] = baseline_rss([PYTHON, "-c", "import torch"], work,
                                                         "base.torch")
    rows = []
    for c in configs:
        rows.append(run_config(c, pooch_run, a.threads, work, torch_ok,
                               epochs=1 if a.quick else None, env=env,
                               pecos_python=pecos_python))
    if a.debtags:
        r = run_debtags(pooch_run, a.threads, work, pecos_python, env)
        if r:
            rows.append(r)
    total = time.time() - t0

    try:
        cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
               if l.startswith("model name")][0]
    except (OSError, IndexError):
        cpu = platform.processor()
    print(f"bench/xmc {datetime.datetime.now().isoformat(timespec='seconds')}  "
          f"{os.cpu_count()} CPUs ({cpu}), --threads {a.threads}, OMP_WAIT_POLICY {policy}, "
          f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
          f"{total:.0f} s in all")
    print("s/epoch: training plus the test evaluation closing each epoch (both sides); CPU s and "
          "wall s: the whole process (data loading included), from /usr/bin/time -v.")
    print(table(rows, base))
    failed = [r["config"] for r in rows
              if r.get("pooch", {}).get("rc") or (r.get("torch") or {}).get("rc")
              or (r.get("pecos") or {}).get("rc")]
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "startup_rss_bytes": base, "seconds": total,
                       "omp_wait_policy": policy, "threads": a.threads}, f, indent=1)
    if failed:
        log("bench/xmc: failed: " + ", ".join(failed) + f" (logs in {work})")
        sys.exit(1)


if __name__ == "__main__":
    main()
