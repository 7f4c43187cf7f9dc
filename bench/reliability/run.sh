#!/usr/bin/env bash
# The reliability benchmarks of docs/RELIABILITY.md (issue 12), longer than
# CI's versions of them:
#   1. kill and resume: `pooch-run train` killed with SIGKILL KILLS times
#      (default 100; CI: 10) at moments drawn from SEED, each checkpoint
#      loaded and resumed to a model byte-identical to an uninterrupted run
#      (tests/cli/test_kill_resume.sh);
#   2. idle CPU over 10 s of a session that trained (2 threads), in a host
#      that sets nothing ("before": OpenMP and OpenBLAS spin) and with the
#      settings pooch-run gives itself ("after"), RUNS times each
#      (tests/unit/test_idle.cpp with POOCH_IDLE_SECONDS=10).
# Usage: bench/reliability/run.sh [BUILD_DIR (build)] [KILLS (100)] [SEED (7)] [RUNS (3)]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
kills=${2:-100}
seed=${3:-7}
runs=${4:-3}

echo "== kill and resume: $kills kills, seed $seed"
start=$(date +%s)
log=$(mktemp "${TMPDIR:-/tmp}/pooch-kill-log.XXXXXX")
rc=0
tests/cli/test_kill_resume.sh "$build/apps/pooch-run" "$kills" "$seed" > "$log" 2>&1 || rc=$?
grep -E '^FAIL' "$log" || true
tail -4 "$log" | sed 's/^/   /'
echo "   checks passed: $(grep -c '^ok' "$log"), failed: $(grep -c '^FAIL' "$log" || true);" \
  "exit $rc; $(( $(date +%s) - start )) s in all (log: $log)"

echo "== idle CPU over 10 s, $runs runs each (load average $(cut -d' ' -f1-3 /proc/loadavg))"
for i in $(seq "$runs"); do
  printf '   before (no settings):      '
  env -u OMP_WAIT_POLICY -u OPENBLAS_THREAD_TIMEOUT POOCH_IDLE_SECONDS=10 \
    "$build/tests/test_idle" | grep -o 'idle 10 s: .* CPU'
  printf '   after (pooch-run settings): '
  OMP_WAIT_POLICY=passive OPENBLAS_THREAD_TIMEOUT=4 POOCH_IDLE_SECONDS=10 \
    "$build/tests/test_idle" | grep -o 'idle 10 s: .* CPU'
done
