#!/usr/bin/env bash
# pooch-run's language-model file commands end to end: tokenize (GPT-2 BPE
# against transformers' ids, bytes, llm.c token files), import and export of
# GPT-2 checkpoints, and their errors and exit codes.
# Usage: test_lm_cli.sh PATH/TO/pooch-run SOURCE_ROOT
set -uo pipefail

RUN=${1:?usage: test_lm_cli.sh PATH/TO/pooch-run SOURCE_ROOT}
SRC=${2:?usage: test_lm_cli.sh PATH/TO/pooch-run SOURCE_ROOT}
RUN=$(cd "$(dirname "$RUN")" && pwd)/$(basename "$RUN")
SRC=$(cd "$SRC" && pwd)
G=$SRC/tests/golden/lm
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cli_scratch lm-cli
# The ids transformers gave TEXT in encodings.json (indent 0: one value a line).
golden_ids() {
  awk -v t="\"text\": \"$1\"," '
    $0 == t { want = 1; next }
    want && /^"ids": \[/ { grab = 1; next }
    grab && /^\]/ { exit }
    grab { gsub(/,/, ""); printf "%s%s", (n++ ? " " : ""), $0 }
  ' "$G/bpe/encodings.json"
  echo
}

for c in import export tokenize; do
  expect "help-$c" 0 "$RUN" "$c" --help
done

# --- tokenize ---------------------------------------------------------------
for text in "Hello, World!" "Crème brûlée à la française" "Русский текст, привет!" "😀 emoji 🎉🎉"; do
  expect tokenize-ids 0 "$RUN" tokenize --tokenizer "$G/bpe" --text "$text"
  want=$(golden_ids "$text")
  [ -n "$want" ] && [ "$(cat tokenize-ids.out)" = "$want" ] && pass "tokenize-golden: $text" ||
    fail "tokenize-golden: $text: got '$(cat tokenize-ids.out)', transformers '$want'"
done
expect tokenize-bytes 0 "$RUN" tokenize --bytes --text "hé"
[ "$(cat tokenize-bytes.out)" = "104 195 169" ] && pass tokenize-bytes-ids || fail tokenize-bytes-ids
expect tokenize-file 0 "$RUN" tokenize --tokenizer "$G/bpe" --text-file "$SRC/apps/data/kjv-genesis.txt" --out genesis.bin --eot --json
n=$(tail -n 1 tokenize-file.out | sed -E 's/.*"tokens":([0-9]+).*/\1/')
size=$(stat -c %s genesis.bin)
[ "$size" = $((1024 + 2 * n)) ] && pass "tokenize-file-size ($n tokens)" || fail "tokenize-file-size: $size bytes for $n tokens"
[ "$n" -gt 20000 ] && [ "$n" -lt 204674 ] && pass tokenize-compresses || fail "tokenize-compresses: $n tokens"
expect tokenize-neither 1 "$RUN" tokenize --text x
expect tokenize-both 1 "$RUN" tokenize --bytes --tokenizer "$G/bpe" --text x
expect tokenize-no-dir 2 "$RUN" tokenize --tokenizer nowhere --text x
contains tokenize-no-dir-msg tokenize-no-dir.err "nowhere/vocab.json"
printf 'ok \xff bad' > bad.txt
expect tokenize-bad-utf8 2 "$RUN" tokenize --tokenizer "$G/bpe" --text-file bad.txt
contains tokenize-bad-utf8-msg tokenize-bad-utf8.err "not valid UTF-8 at byte 3"
expect tokenize-dir-as-text 2 "$RUN" tokenize --bytes --text-file "$G"
contains tokenize-dir-as-text-msg tokenize-dir-as-text.err "directory"

# --- import and export --------------------------------------------------------
expect import-token-file 2 "$RUN" import --from genesis.bin --out m.pooch
contains import-token-file-msg import-token-file.err "token file, not a model"
expect import-not-gpt-dir 2 "$RUN" import --from "$G/bpe" --out m.pooch
expect export-missing 2 "$RUN" export --model missing.pooch --to out
expect import-hf 0 "$RUN" import --from "$G/hf_tiny" --out hf.pooch
expect import-llmc 0 "$RUN" import --from "$G/llmc_tiny_f32.bin" --out llmc.pooch
expect export-hf 0 "$RUN" export --model hf.pooch --to exported
for f in config.json model.safetensors; do
  cmp -s "exported/$f" "$G/pooch_export/$f" && pass "export-golden-$f" || fail "export-golden-$f"
done

echo
finish
