#!/usr/bin/env bash
# The edges of a training run, end to end through pooch-run:
#  - resuming on other data: refused with exit 2, naming the checkpoint, the
#    data file and both data fingerprints, unless --force; the same data, or
#    --force, go on;
#  - a full disk (a file-size limit, `ulimit -f`, which is what a full disk
#    looks like to write(): it fails midway): exit 2 with the OS's reason,
#    the previous checkpoint byte for byte intact, no temporary file left;
#  - a read-only output folder: exit 2 with a message, the checkpoint intact
#    (run as an unprivileged user when the test runs as root, whom directory
#    permissions do not stop);
#  - an address-space limit (`ulimit -v`) below what a model needs: exit 3,
#    naming the bytes asked for and the bytes there were, and no hang.
# Usage: test_edges.sh PATH/TO/pooch-run
set -uo pipefail

RUN=${1:?usage: test_edges.sh PATH/TO/pooch-run}
RUN=$(cd "$(dirname "$RUN")" && pwd)/$(basename "$RUN")
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cli_scratch edges
same() {  # same NAME FILE1 FILE2
  if cmp -s "$2" "$3"; then pass "$1"; else fail "$1: $2 differs from $3"; fi
}
no_temporaries() {  # no_temporaries NAME DIR
  local left
  left=$(ls -A "$2" | grep -E '\.tmp-[0-9]+' || true)
  [ -z "$left" ] && pass "$1" || fail "$1: temporary files left: $left"
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

# --- a full disk: a file-size limit ----------------------------------------------
# 64 KiB: the data and its cache are read (the caches exist already), the
# checkpoint (about 140 KiB) cannot be written.
cp keep.ckpt full.ckpt
expect full-disk 2 bash -c 'ulimit -f 64 && exec "$0" "$@"' "$RUN" train --data data "${F[@]}" \
  --out full.pooch --checkpoint full.ckpt --resume full.ckpt
contains full-disk-says-why full-disk.err 'full\.ckpt.*(File too large|No space)'
same full-disk-keeps-checkpoint full.ckpt keep.ckpt
[ ! -e full.pooch ] && pass "full-disk-writes-no-model" || fail "full-disk-writes-no-model"
no_temporaries full-disk-no-temporaries .

# --- a read-only output folder -----------------------------------------------------
mkdir ro
cp keep.ckpt ro/c.ckpt
chmod 555 ro
AS=()
RUN_RO=$RUN
if [ "$(id -u)" = 0 ]; then
  # root writes into a read-only folder regardless: run as nobody, who can
  # read this folder and the data but not write into ro/. nobody must reach
  # the program too, which a build in a folder closed to others (a clone in
  # /root, or in a mktemp -d folder) does not let it: a copy runs from here,
  # with the library where its $ORIGIN run path looks.
  mkdir -p bin/apps bin/runtime/api
  cp "$RUN" bin/apps/
  cp -P "$(dirname "$RUN")"/../runtime/api/libpooch.so* bin/runtime/api/ 2> /dev/null
  RUN_RO=$TMP/bin/apps/$(basename "$RUN")
  chmod 755 "$TMP"
  chmod -R a+rX "$TMP"
  chmod 555 ro
  AS=(setpriv --reuid=65534 --regid=65534 --clear-groups)
fi
if "${AS[@]}" "$RUN_RO" --version > /dev/null 2>&1; then
  expect read-only 2 "${AS[@]}" "$RUN_RO" train --data data "${F[@]}" --out ro/m.pooch \
    --checkpoint ro/c.ckpt --resume ro/c.ckpt
  contains read-only-says-why read-only.err 'ro/(m\.pooch|c\.ckpt).*(Permission denied|Read-only)'
  same read-only-keeps-checkpoint ro/c.ckpt keep.ckpt
  no_temporaries read-only-no-temporaries ro
else
  echo "skip read-only: the unprivileged user cannot run $RUN_RO"
fi

# --- an address-space limit ------------------------------------------------------
# A model whose arena is about 1.2 GB (707 x 100000 weights, their
# gradients and two Adam moments) under a 600 MB limit: the message gives
# the bytes asked for and what the limit leaves, not the machine's free memory.
# (AddressSanitizer reserves terabytes of address space: no ulimit -v there.)
# (gcc links the sanitizer's library, clang puts its runtime in the program:
# either way the program names __asan_init or __tsan_init.)
if grep -aqE '__(a|t)san_init' "$RUN"; then
  echo "skip low-memory (a sanitizer build)"
else
  expect low-memory 3 timeout 120 bash -c 'ulimit -v 600000 && exec "$0" "$@"' "$RUN" train \
    --data data --epochs 1 --hidden 100000 --fan-in 4 --threads 1 --device cpu --out big.pooch
  contains low-memory-names-bytes low-memory.err 'could not take [0-9]+ bytes .*; [0-9.]+ MiB are available'
  avail=$(grep -Eo '[0-9.]+ MiB are available' low-memory.err | cut -d' ' -f1)
  if [ -n "$avail" ] && awk -v a="$avail" 'BEGIN { exit !(a < 600000 / 1024) }'; then
    pass "low-memory-available-honours-the-limit ($avail MiB)"
  else
    fail "low-memory-available-honours-the-limit: '$avail' MiB is not below the 586 MiB limit"
  fi
  [ ! -e big.pooch ] && pass "low-memory-writes-no-model" || fail "low-memory-writes-no-model"
fi

finish
