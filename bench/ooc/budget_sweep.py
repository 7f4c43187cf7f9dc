#!/usr/bin/env python3
"""Plans one train step at a series of device budgets and reports where a
larger budget predicts a slower step than a smaller one (the planner's
monotonicity in the budget; docs/BENCHMARKS.md "More memory, never a much
slower plan").

  bench/ooc/budget_sweep.py build/apps/pooch-run "--spec S.json --machine machines/gtx1650.json" "200 208 216"

The second argument holds `pooch-run plan` flags; the third the budgets in
MiB. Prints each budget's predicted step and planning time, then the count
of budgets slower than some smaller one and the worst such ratio.
"""
import json
import subprocess
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    pooch_run, flags, budgets = sys.argv[1], sys.argv[2].split(), [float(b) for b in sys.argv[3].split()]
    rows = []
    for b in budgets:
        out = subprocess.run([pooch_run, "plan", "--json", "--threads", "2", *flags,
                              "--device-memory", f"{b:g}M"], capture_output=True, text=True)
        last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "{}"
        plan = json.loads(last).get("plan", {})
        rows.append((b, plan.get("predicted_seconds"), plan.get("plan_seconds")))
    slower, worst = 0, 0.0
    for b, t, ps in rows:
        if t is None:
            print(f"{b:8.2f} does not fit")
            continue
        below = [t2 for b2, t2, _ in rows if b2 < b and t2 is not None]
        note = ""
        if below and t > min(below) * 1.000001:
            slower += 1
            worst = max(worst, t / min(below) - 1)
            note = f"  slower than a smaller budget by {100 * (t / min(below) - 1):.1f}%"
        print(f"{b:8.2f} {t:.5f} s  plan {ps * 1e3:.0f} ms{note}")
    print(f"slower than a smaller budget: {slower} of {len(rows)}, worst {100 * worst:.1f}%")


if __name__ == "__main__":
    main()
