#!/usr/bin/env bash
# Runs every libFuzzer target of tests/fuzz for SECONDS each (CI: 30, a smoke
# test), $FUZZ_JOBS at a time (default: one per core; a libFuzzer process runs
# on one thread), from its committed seed corpus (tests/fuzz/corpus/<t>,
# read only: new inputs go to a temporary folder) with its dictionary.
# Fails when any target finds something: a crash, a sanitizer report, an input
# slower than 10 s (a hang) or one that needs more than 2 GiB; the input is saved as
# $ARTIFACTS/crash-* (default: a temporary folder, printed) to add to the
# corpus once fixed. Extra arguments go to every target (e.g. -runs=N).
# Usage: tests/fuzz/run.sh BUILD_DIR [SECONDS] [TARGET...] [-- LIBFUZZER_FLAGS...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run.sh BUILD_DIR [SECONDS] [TARGET...] [-- FLAGS...]}
seconds=${2:-30}
shift $(($# < 2 ? $# : 2))
targets=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do targets+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
# Default: every target the build has (tests/fuzz/meson.build lists them).
if [ ${#targets[@]} -eq 0 ]; then
  for bin in "$build"/tests/fuzz/fuzz_*; do
    [ -x "$bin" ] && [ -f "$bin" ] && targets+=("${bin##*/fuzz_}")
  done
  [ ${#targets[@]} -gt 0 ] || { echo "run.sh: $build has no fuzz targets (meson setup -Dfuzz=enabled)" >&2; exit 1; }
fi

# A target's dictionary is <target>.dict, or the one of the format it shares.
declare -A dict_alias=([xmc_bow]=xmc_text [xmc_split]=xmc_text [image_npy]=npy)
artifacts=${ARTIFACTS:-$(mktemp -d "${TMPDIR:-/tmp}/pooch-fuzz-artifacts.XXXXXX")}
work=$(mktemp -d "${TMPDIR:-/tmp}/pooch-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

for t in "${targets[@]}"; do
  bin=$build/tests/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "run.sh: $bin is not built (meson setup -Dfuzz=enabled)" >&2; exit 1; }
done

# One target: its log in $work/<t>.log, its exit status in $work/<t>.rc.
fuzz_one() {
  local t=$1 rc=0
  local flags=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
    -artifact_prefix="$artifacts/$t-")
  local d=$here/${dict_alias[$t]:-$t}.dict
  [ -f "$d" ] && flags+=(-dict="$d")
  mkdir -p "$work/$t"
  "$build/tests/fuzz/fuzz_$t" "${flags[@]}" "${extra[@]}" "$work/$t" "$here/corpus/$t" \
    > "$work/$t.log" 2>&1 || rc=$?
  echo "$rc" > "$work/$t.rc"
}

extra=("$@")
jobs=${FUZZ_JOBS:-$(nproc)}
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  fuzz_one "$t" &
done
wait

# The reports in the targets' order, whichever finished first.
failed=()
for t in "${targets[@]}"; do
  echo "== fuzz_$t: ${seconds} s"
  if [ "$(cat "$work/$t.rc")" != 0 ]; then
    tail -60 "$work/$t.log"
    failed+=("fuzz_$t")
    continue
  fi
  grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|cov: .* ft: ' "$work/$t.log" |
    tail -3 | sed 's/^/   /'
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "run.sh: ${failed[*]} found a problem; the inputs are in $artifacts" >&2
  exit 1
fi
echo "fuzzing: no findings in ${targets[*]}"
