#!/usr/bin/env bash
# Runs every libFuzzer target of tests/fuzz for SECONDS each (CI: 30, a smoke
# test), one at a time, from its committed seed corpus (tests/fuzz/corpus/<t>,
# read only: new inputs go to a temporary folder) with its dictionary.
# Fails on the first finding: a crash, a sanitizer report, an input slower
# than 10 s (a hang) or one that needs more than 2 GiB; the input is saved as
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
[ ${#targets[@]} -gt 0 ] || targets=(xmc_bow xmc_split xmc_cache npy pooch_file model_spec safetensors llmc_tokens
  bpe_tokenizer image_npy gpt_checkpoint)

declare -A dict=([xmc_bow]=xmc_text [xmc_split]=xmc_text [npy]=npy [pooch_file]=pooch_file
  [model_spec]=model_spec [safetensors]=safetensors [bpe_tokenizer]=bpe_tokenizer [image_npy]=npy
  [gpt_checkpoint]=gpt_checkpoint)
artifacts=${ARTIFACTS:-$(mktemp -d "${TMPDIR:-/tmp}/pooch-fuzz-artifacts.XXXXXX")}
work=$(mktemp -d "${TMPDIR:-/tmp}/pooch-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

for t in "${targets[@]}"; do
  bin=$build/tests/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "run.sh: $bin is not built (meson setup -Dfuzz=enabled)" >&2; exit 1; }
  flags=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
    -artifact_prefix="$artifacts/$t-")
  [ -n "${dict[$t]:-}" ] && flags+=(-dict="$here/${dict[$t]}.dict")
  mkdir -p "$work/$t"
  echo "== fuzz_$t: ${seconds} s"
  if ! "$bin" "${flags[@]}" "$@" "$work/$t" "$here/corpus/$t" > "$work/$t.log" 2>&1; then
    tail -60 "$work/$t.log"
    echo "run.sh: fuzz_$t found a problem; the input is in $artifacts" >&2
    exit 1
  fi
  grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|cov: .* ft: ' "$work/$t.log" |
    tail -3 | sed 's/^/   /'
done
echo "fuzzing: no findings in ${targets[*]}"
