#!/usr/bin/env bash
# The edges of a training run, end to end through pooch-run:
#  - resuming on other data: refused with exit 2, naming the checkpoint, the
#    data file and both data fingerprints, unless --force; the same data, or
#    --force, go on.
# Usage: test_edges.sh PATH/TO/pooch-run
set -uo pipefail

RUN=${1:?usage: test_edges.sh PATH/TO/pooch-run}
RUN=$(cd "$(dirname "$RUN")" && pwd)/$(basename "$RUN")
TMP=$(mktemp -d "${TMPDIR:-/tmp}/pooch-edges.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
cd "$TMP" || exit 1

failures=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; failures=$((failures + 1)); }
# expect NAME WANT_RC CMD...: runs CMD (stdout > NAME.out, stderr > NAME.err).
expect() {
  local name=$1 want=$2
  shift 2
  "$@" > "$name.out" 2> "$name.err"
  local rc=$?
  if [ "$rc" = "$want" ]; then
    pass "$name (exit $rc)"
    return 0
  fi
  fail "$name: exit $rc, wanted $want"
  sed 's/^/    | /' "$name.err" | tail -5
  return 1
}
# contains NAME FILE PATTERN (extended regex)
contains() {
  if grep -Eq -- "$3" "$2"; then pass "$1"; else
    fail "$1: '$3' not in $2"
    sed 's/^/    | /' "$2" | tail -5
  fi
}
same() {  # same NAME FILE1 FILE2
  if cmp -s "$2" "$3"; then pass "$1"; else fail "$1: $2 differs from $3"; fi
}
F=(--epochs 2 --early-stop 0 --hidden 16 --fan-in 4 --batch 32 --seed 7 --threads 1 --device cpu)
# Two data sets of one shape (the preset fixes it) and different rows.
"$RUN" synth --preset EURLex-4K --scale 0.02 --seed 3 --out data > synth.log 2>&1 &&
  "$RUN" synth --preset EURLex-4K --scale 0.02 --seed 4 --out data2 >> synth.log 2>&1 ||
  { echo "FAIL synth"; cat synth.log; exit 1; }

# --- resume on other data ------------------------------------------------------
expect first 0 "$RUN" train --data data "${F[@]}" --out a.pooch --max-steps 3
expect first-info 0 "$RUN" info a.pooch.ckpt --json
contains checkpoint-has-fingerprint first-info.out \
  '"train\.data\.fingerprint":"xxh3 [0-9a-f]{16} \([0-9]+ rows, [0-9]+ features, [0-9]+ labels\)"'
cp a.pooch.ckpt keep.ckpt
expect other-data 2 "$RUN" train --data data2 "${F[@]}" --out b.pooch --resume a.pooch.ckpt
contains other-data-names-checkpoint other-data.err 'a\.pooch\.ckpt was trained on other data'
contains other-data-names-file other-data.err 'data2/train\.txt'
contains other-data-says-force other-data.err '--force'
n=$(grep -Eo 'xxh3 [0-9a-f]{16}' other-data.err | sort -u | wc -l)
[ "$n" = 2 ] && pass "other-data-names-both-fingerprints" ||
  fail "other-data-names-both-fingerprints: $n distinct fingerprints in the message"
[ ! -e b.pooch ] && pass "other-data-writes-no-model" || fail "other-data-writes-no-model"
same other-data-keeps-checkpoint a.pooch.ckpt keep.ckpt
cp keep.ckpt s.ckpt
expect same-data 0 "$RUN" train --data data "${F[@]}" --out s.pooch --checkpoint s.ckpt --resume s.ckpt
cp keep.ckpt f.ckpt
expect other-data-forced 0 "$RUN" train --data data2 "${F[@]}" --out f.pooch --checkpoint f.ckpt \
  --resume f.ckpt --force
expect forced-info 0 "$RUN" info f.ckpt --json
# After --force the run trains on the new data, and its checkpoint says so.
fp() { grep -Eo '"train\.data\.fingerprint":"[^"]*"' "$1"; }
[ -n "$(fp forced-info.out)" ] && [ "$(fp forced-info.out)" != "$(fp first-info.out)" ] &&
  pass "forced-checkpoint-has-new-fingerprint" ||
  fail "forced-checkpoint-has-new-fingerprint: $(fp forced-info.out)"

echo "$failures failed"
[ "$failures" = 0 ]
