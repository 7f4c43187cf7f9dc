#!/usr/bin/env bash
# pooch-run's language-model training and generation end to end: a tiny
# byte-level gpt trained from a spec on the committed Genesis text (the loss
# falls; validation loss and perplexity are reported), a run stopped and
# resumed equal byte for byte to one that ran through, finetuning with
# another run shape, the errors and exit codes of bad input, and generate:
# greedy decoding of the imported tests/golden/lm/hf_tiny equal to
# transformers' generate (tests/golden/lm/hf_tiny_generate.json), seeded
# sampling deterministic, --max-tokens and Ctrl-C stopping cleanly; LoRA
# finetuning (adapters only, resumed bit for bit), merge-lora (the merged
# model samples as the adapted one) and their refusals.
# Usage: test_lm_train_cli.sh PATH/TO/pooch-run SOURCE_ROOT
set -uo pipefail

RUN=${1:?usage: test_lm_train_cli.sh PATH/TO/pooch-run SOURCE_ROOT}
SRC=${2:?usage: test_lm_train_cli.sh PATH/TO/pooch-run SOURCE_ROOT}
RUN=$(cd "$(dirname "$RUN")" && pwd)/$(basename "$RUN")
SRC=$(cd "$SRC" && pwd)
G=$SRC/tests/golden/lm
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cli_scratch lm-train
# A field of the --json line (the last line of stdout).
field() { tail -n 1 "$1" | python3 -c "import json,sys; print(json.load(sys.stdin)$2)"; }

head -c 60000 "$SRC/apps/data/kjv-genesis.txt" > genesis.txt
cat > tiny.json << 'JSON'
{"family": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_ctx": 32}
JSON
FLAGS=(--spec tiny.json --bytes --batch 8 --context 32 --steps 60 --eval-every 30 --lr 3e-3
  --warmup 5 --seed 3 --threads 2)
TRAIN=(train --data genesis.txt "${FLAGS[@]}")

# --- train from a spec: the loss falls ---------------------------------------
expect train-full 0 "$RUN" "${TRAIN[@]}" --out full.pooch --log full.jsonl --json
contains train-val-line train-full.out "step 30  validation loss [0-9.]+  perplexity"
first=$(grep '"type":"step"' full.jsonl | head -n 5 | python3 -c \
  "import json,sys; v=[json.loads(l)['loss'] for l in sys.stdin]; print(sum(v)/len(v))")
last=$(grep '"type":"step"' full.jsonl | tail -n 5 | python3 -c \
  "import json,sys; v=[json.loads(l)['loss'] for l in sys.stdin]; print(sum(v)/len(v))")
python3 -c "import sys; sys.exit(0 if $last < $first - 1.0 else 1)" &&
  pass "train-loss-falls ($first -> $last)" || fail "train-loss-falls: $first -> $last"
val=$(field train-full.out "['final']['val_loss']")
ppl=$(field train-full.out "['final']['perplexity']")
steps=$(field train-full.out "['steps']")
[ "$steps" = 60 ] && pass "train-steps (60)" || fail "train-steps: $steps, wanted 60"
# Below the uniform byte distribution's ln 256 = 5.545, and perplexity = exp(loss).
python3 -c "import math,sys; sys.exit(0 if $val < 4.0 and abs(math.exp($val) - $ppl) < 1e-6 * $ppl else 1)" &&
  pass "train-validation ($val, perplexity $ppl)" || fail "train-validation: loss $val perplexity $ppl"

# A spec through a pipe is read once (the family is looked up in the same text).
expect train-spec-pipe 0 "$RUN" train --data genesis.txt --spec <(cat tiny.json) --bytes --batch 8 \
  --steps 2 --threads 2 --out pipe.pooch

# --- stop and resume: the same bytes as the run that went through -----------
expect train-part 0 "$RUN" "${TRAIN[@]}" --out part.pooch --max-steps 23
contains train-part-msg train-part.out "stopped \(--max-steps\) at step 23"
expect train-resume 0 "$RUN" "${TRAIN[@]}" --out part.pooch --resume part.pooch.ckpt
cmp -s full.pooch part.pooch && pass "resume-bit-identical" || fail "resume-bit-identical"
expect train-resume-done 0 "$RUN" "${TRAIN[@]}" --out again.pooch --resume full.pooch.ckpt
contains train-resume-done-steps train-resume-done.out "trained 0 steps"

# --- finetune with another run shape ----------------------------------------
expect finetune 0 "$RUN" finetune --model full.pooch --data genesis.txt --bytes --steps 4 \
  --batch 4 --context 16 --threads 2 --out ft.pooch --json
[ "$(field finetune.out "['model_spec']['seq']")" = 16 ] && pass finetune-context ||
  fail "finetune-context: $(field finetune.out "['model_spec']")"
python3 -c "import sys; sys.exit(0 if $(field finetune.out "['final']['val_loss']") < 4.0 else 1)" &&
  pass "finetune-keeps-weights" || fail "finetune-keeps-weights"
expect finetune-resume-shape 0 "$RUN" finetune --model full.pooch --data genesis.txt --bytes \
  --steps 4 --batch 4 --context 16 --threads 2 --out ft2.pooch --max-steps 2
expect finetune-resume 0 "$RUN" finetune --data genesis.txt --bytes --steps 4 --threads 2 \
  --out ft2.pooch --resume ft2.pooch.ckpt
cmp -s ft.pooch ft2.pooch && pass "finetune-resume-bit-identical" || fail "finetune-resume-bit-identical"

# --clip-norm: gpt models clip to 1 by default; 0 turns it off, and a tight
# norm changes the training; a negative one is refused before any work.
CLIP=(train --data genesis.txt --spec tiny.json --bytes --batch 8 --steps 5 --seed 3 --threads 2)
expect clip-off 0 "$RUN" "${CLIP[@]}" --clip-norm 0 --out clip0.pooch
expect clip-tight 0 "$RUN" "${CLIP[@]}" --clip-norm 0.01 --out clip001.pooch
cmp -s clip0.pooch clip001.pooch && fail "clip-changes-training: the same bytes" ||
  pass "clip-changes-training"
expect err-clip-negative 2 "$RUN" train --data genesis.txt "${FLAGS[@]}" --clip-norm -1 \
  --out x.pooch
contains err-clip-negative-msg err-clip-negative.err "clip-norm"

# plan takes a gpt spec as it is (it once added an XMC input width to it).
expect plan-gpt-spec 0 "$RUN" plan --spec tiny.json --threads 2
# ... with the optimizer train gives a gpt model when none is named: AdamW.
contains plan-gpt-spec-msg plan-gpt-spec.out "plan of a train step of tiny.json \(gpt, adamw,"
# A key given twice is refused, not silently the last one (a gpt spec is
# written out again with --batch applied, which would keep only one).
sed 's/^{/{"n_layer": 1, /' tiny.json > twice.json
expect err-gpt-spec-twice 2 "$RUN" train --data genesis.txt --spec twice.json --bytes --steps 1 \
  --out twice.pooch --threads 2
contains err-gpt-spec-twice-msg err-gpt-spec-twice.err 'the key "n_layer" appears twice'

# --- LoRA: adapters train, the base stays; merge-lora folds them in ---------
LORA=(finetune --model full.pooch --data genesis.txt --bytes --steps 20 --lr 1e-2 --lora-rank 4
  --lora-alpha 8 --lora-targets attn,mlp --threads 2)
expect lora 0 "$RUN" "${LORA[@]}" --out lora.pooch --json
contains lora-msg lora.out "LoRA: rank 4, alpha 8, on attn,mlp"
[ "$(field lora.out "['model_spec']['lora']['rank']")" = 4 ] && pass lora-spec ||
  fail "lora-spec: $(field lora.out "['model_spec']")"
python3 -c "import sys; sys.exit(0 if $(field lora.out "['final']['val_loss']") < $val else 1)" &&
  pass "lora-lowers-validation-loss (below $val)" || fail "lora-lowers-validation-loss"
expect lora-part 0 "$RUN" "${LORA[@]}" --out lora-part.pooch --max-steps 7
expect lora-resume 0 "$RUN" finetune --data genesis.txt --bytes --steps 20 --lr 1e-2 --threads 2 \
  --out lora-part.pooch --resume lora-part.pooch.ckpt
cmp -s lora.pooch lora-part.pooch && pass "lora-resume-bit-identical" ||
  fail "lora-resume-bit-identical"
expect merge-lora 0 "$RUN" merge-lora --model lora.pooch --out merged.pooch
# Seeded sampling: the tiny model's greedy output is all spaces, base or not.
G1=(generate --prompt "And God said" --max-tokens 24 --temperature 1 --seed 4 --ids --threads 2)
expect gen-lora 0 "$RUN" "${G1[@]}" --model lora.pooch
expect gen-merged 0 "$RUN" "${G1[@]}" --model merged.pooch
expect gen-base 0 "$RUN" "${G1[@]}" --model full.pooch
cmp -s gen-lora.out gen-merged.out && pass "merged-generates-as-adapted" ||
  fail "merged-generates-as-adapted: $(cat gen-lora.out) / $(cat gen-merged.out)"
cmp -s gen-lora.out gen-base.out && fail "lora-changed-nothing: $(cat gen-base.out)" ||
  pass "lora-changed-the-model"
expect export-merged 0 "$RUN" export --model merged.pooch --to merged-hf
expect err-export-lora 2 "$RUN" export --model lora.pooch --to lora-hf
contains err-export-lora-msg err-export-lora.err "merge-lora"
expect err-merge-plain 2 "$RUN" merge-lora --model full.pooch --out x.pooch
contains err-merge-plain-msg err-merge-plain.err "full.pooch: has no LoRA adapters"
[ ! -e x.pooch ] && pass "err-merge-plain-writes-nothing" || fail "err-merge-plain-writes-nothing"
expect err-lora-twice 1 "$RUN" finetune --model lora.pooch --data genesis.txt --bytes --steps 1 \
  --lora-rank 2 --out x.pooch
contains err-lora-twice-msg err-lora-twice.err "already has rank-4 adapters"
expect err-lora-rank 2 "$RUN" finetune --model full.pooch --data genesis.txt --bytes \
  --lora-rank 33 --out x.pooch
contains err-lora-rank-msg err-lora-rank.err "\-\-lora-rank 33 is more than the model's width \(n_embd 32\)"
expect err-lora-target 1 "$RUN" finetune --model full.pooch --data genesis.txt --bytes \
  --lora-rank 2 --lora-targets ffn --out x.pooch
contains err-lora-target-msg err-lora-target.err "unknown target 'ffn'"
expect err-lora-alpha-alone 1 "$RUN" finetune --model full.pooch --data genesis.txt --bytes \
  --lora-alpha 4 --out x.pooch

# --- bad input ---------------------------------------------------------------
expect err-missing 2 "$RUN" finetune --model full.pooch --data missing.bin --out x.pooch
contains err-missing-msg err-missing.err "missing.bin"
expect err-context 2 "$RUN" finetune --model full.pooch --data genesis.txt --bytes --context 64 \
  --out x.pooch
contains err-context-msg err-context.err "--context 64 is longer than the model's context length \(n_ctx 32\)"
"$RUN" tokenize --tokenizer "$G/bpe" --text "The vocabulary of GPT-2 is larger than bytes" \
  --out bpe.bin > /dev/null
expect err-vocab 2 "$RUN" finetune --model full.pooch --data bpe.bin --out x.pooch
contains err-vocab-msg err-vocab.err "token 1 is [0-9]+, outside the model's vocabulary \[0, 256\)"
expect err-text-no-bytes 2 "$RUN" finetune --model full.pooch --data genesis.txt --out x.pooch
contains err-text-no-bytes-msg err-text-no-bytes.err "--bytes"
head -c 40 genesis.txt > short.txt
expect err-short 2 "$RUN" finetune --model full.pooch --data short.txt --bytes --out x.pooch
contains err-short-msg err-short.err "40 tokens"
# .npy files written by hand (version 1.0: magic, header length, header padded to 64 bytes).
npy() {
  python3 - "$@" << 'PY'
import struct, sys
path, dtype, raw = sys.argv[1], sys.argv[2], sys.argv[3]
vals = open(raw[1:], "rb").read() if raw.startswith("@") else bytes()
if raw.startswith("@"):
    data, n = b"".join(struct.pack("<i", b) for b in vals), len(vals)
else:
    ids = [int(x) for x in raw.split(",")]
    data, n = b"".join(struct.pack("<q" if dtype == "<i8" else "<i", v) for v in ids), len(ids)
head = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (dtype, n)
head += " " * (63 - (10 + len(head)) % 64) + "\n"
open(path, "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode() + data)
PY
}
npy ids.npy "<i8" "1,2,-3"
expect err-npy-negative 2 "$RUN" finetune --model full.pooch --data ids.npy --out x.pooch
contains err-npy-negative-msg err-npy-negative.err "element 2 is -3"
npy ok.npy "<i4" "@genesis.txt"
expect npy-ids 0 "$RUN" finetune --model full.pooch --data ok.npy --steps 2 --threads 2 --out npy.pooch
head -c 50000 "$SRC/apps/data/kjv-genesis.txt" | tail -c 20000 > other.txt
expect err-resume-other-data 2 "$RUN" train --data other.txt "${FLAGS[@]}" --out part.pooch \
  --resume part.pooch.ckpt
contains err-resume-other-data-msg err-resume-other-data.err "trained on other data"
expect err-new-head 1 "$RUN" finetune --model full.pooch --data genesis.txt --bytes --new-head 5 \
  --out x.pooch

# --- generate ----------------------------------------------------------------
expect import-hf 0 "$RUN" import --from "$G/hf_tiny" --out hf.pooch
ncases=$(python3 -c "import json; print(len(json.load(open('$G/hf_tiny_generate.json'))['cases']))")
for i in $(seq 0 $((ncases - 1))); do
  prompt=$(python3 -c "import json; print(' '.join(map(str, json.load(open('$G/hf_tiny_generate.json'))['cases'][$i]['prompt'])))")
  want=$(python3 -c "import json; print(' '.join(map(str, json.load(open('$G/hf_tiny_generate.json'))['cases'][$i]['generated'])))")
  # Ask for more than fit: generation stops where the context (16) is full,
  # or at the count transformers was given.
  n=$(python3 -c "import json; print(json.load(open('$G/hf_tiny_generate.json'))['cases'][$i]['max_new_tokens'])")
  expect "generate-greedy-$i" 0 "$RUN" generate --model hf.pooch --prompt-tokens "$prompt" \
    --temperature 0 --max-tokens "$n" --ids --threads 2
  got=$(head -n 1 "generate-greedy-$i.out")
  [ "$got" = "$want" ] && pass "generate-golden-$i ($got)" ||
    fail "generate-golden-$i: got '$got', transformers '$want'"
done
# A full context (16): 3 prompt tokens, 13 fed back, and the last one
# predicted from all 16 positions: 14 new tokens, the first 13 transformers'.
expect generate-context-full 0 "$RUN" generate --model hf.pooch --prompt-tokens "1,2,3" \
  --temperature 0 --max-tokens 100 --ids --threads 2
got=$(head -n 1 generate-context-full.out)
[ "$(echo "$got" | wc -w)" = 14 ] && [ "$(echo "$got" | cut -d' ' -f1-13)" = "$want" ] &&
  pass "generate-stops-at-context ($got)" || fail "generate-stops-at-context: $got"
# --slide goes on past a full context from its last half: 40 tokens, the
# first 14 those of the run that stopped.
expect generate-slide 0 "$RUN" generate --model hf.pooch --prompt-tokens "1,2,3" \
  --temperature 0 --max-tokens 40 --ids --slide --threads 2
slid=$(head -n 1 generate-slide.out)
[ "$(echo "$slid" | wc -w)" = 40 ] && [ "$(echo "$slid" | cut -d' ' -f1-14)" = "$got" ] &&
  pass "generate-slide (40 tokens)" || fail "generate-slide: $slid"
S=(generate --model full.pooch --prompt "In the beginning" --max-tokens 12 --temperature 1 --top-k 20
  --top-p 0.95 --threads 2 --ids)
expect sample-a 0 "$RUN" "${S[@]}" --seed 5
expect sample-b 0 "$RUN" "${S[@]}" --seed 5
expect sample-c 0 "$RUN" "${S[@]}" --seed 6
[ "$(wc -w < sample-a.out)" = 12 ] && pass "sample-max-tokens (12)" || fail "sample-max-tokens: $(cat sample-a.out)"
cmp -s sample-a.out sample-b.out && pass "sample-same-seed" || fail "sample-same-seed"
cmp -s sample-a.out sample-c.out && fail "sample-other-seed: the same tokens" || pass "sample-other-seed"
expect generate-text 0 "$RUN" generate --model full.pooch --prompt "And God said" --max-tokens 20 \
  --temperature 0 --threads 2
contains generate-text-prompt generate-text.out "^And God said"
expect err-generate-tokenizer-too-big 2 "$RUN" generate --model hf.pooch --prompt "Hello" \
  --tokenizer "$G/bpe"
contains err-generate-tokenizer-too-big-msg err-generate-tokenizer-too-big.err "1000 tokens, more than the model's vocabulary \(50\)"
# Text through GPT-2's BPE: a model over the test tokenizer's 1000 tokens.
"$RUN" tokenize --tokenizer "$G/bpe" --text-file genesis.txt --out genesis-bpe.bin > /dev/null
cat > bpe.json << 'JSON'
{"family": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 32, "n_ctx": 32, "vocab_size": 1000}
JSON
expect bpe-model 0 "$RUN" train --spec bpe.json --data genesis-bpe.bin --batch 4 --steps 20 \
  --threads 2 --out bpe.pooch
expect generate-bpe-text 0 "$RUN" generate --model bpe.pooch --tokenizer "$G/bpe" \
  --prompt "In the beginning" --max-tokens 10 --temperature 0 --threads 2 --json
contains generate-bpe-text-prompt generate-bpe-text.out "^In the beginning"
[ "$(field generate-bpe-text.out "['tokens'].__len__()")" = 10 ] && pass generate-bpe-count ||
  fail "generate-bpe-count: $(tail -n 1 generate-bpe-text.out)"
expect err-generate-no-prompt 1 "$RUN" generate --model hf.pooch
expect err-generate-text-no-tokenizer 1 "$RUN" generate --model hf.pooch --prompt "Hello"
contains err-generate-text-no-tokenizer-msg err-generate-text-no-tokenizer.err "--tokenizer"
expect err-generate-bad-id 1 "$RUN" generate --model hf.pooch --prompt-tokens "1 99" --ids
contains err-generate-bad-id-msg err-generate-bad-id.err "99"
expect err-generate-word 2 "$RUN" generate --model hf.pooch --prompt-tokens "1 x" --ids
expect err-generate-not-a-model 2 "$RUN" generate --model tiny.json --prompt-tokens 1

# Ctrl-C: a model with a long context, stopped once tokens are streaming.
cat > long.json << 'JSON'
{"family": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 128, "n_ctx": 4096}
JSON
expect long-model 0 "$RUN" train --spec long.json --data genesis.txt --bytes --batch 1 --context 64 \
  --steps 1 --threads 2 --out long.pooch
"$RUN" generate --model long.pooch --prompt "In" --max-tokens 4000 --threads 2 --ids \
  > sigint.out 2> sigint.err &
pid=$!
for _ in $(seq 1 200); do
  [ "$(wc -w < sigint.out)" -gt 20 ] && break
  sleep 0.05
done
kill -INT "$pid" 2> /dev/null
wait "$pid"
rc=$?
n=$(head -n 1 sigint.out | wc -w)
[ "$rc" = 130 ] && [ "$n" -gt 20 ] && [ "$n" -lt 4000 ] &&
  pass "generate-sigint (exit 130 after $n tokens)" || fail "generate-sigint: exit $rc after $n tokens"

echo
finish
