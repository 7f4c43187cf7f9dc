#!/usr/bin/env bash
# End-to-end test of pooch-run on tiny synthetic data: every subcommand,
# --json, exit codes, error messages, Ctrl-C and bit-exact resuming.
# Usage: test_cli.sh PATH/TO/pooch-run
set -uo pipefail

RUN=${1:?usage: test_cli.sh PATH/TO/pooch-run}
RUN=$(cd "$(dirname "$RUN")" && pwd)/$(basename "$RUN")
MACHINES=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../machines" && pwd)  # before the cd below
TEST_DATA=$(cd "$(dirname "${BASH_SOURCE[0]}")/../data" && pwd)
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cli_scratch cli
json_last() { tail -n 1 "$1"; }

T=(--threads 1 --device cpu)

# --- help and usage ---------------------------------------------------------
expect help 0 "$RUN" --help
for c in demo synth train finetune eval predict info plan profile; do
  expect "help-$c" 0 "$RUN" "$c" --help
done
expect bad-flag 1 "$RUN" train --no-such-flag
expect no-subcommand 1 "$RUN"
expect bad-size 1 "$RUN" train --data . --device-memory 12Q

# --- synth ---------------------------------------------------------------------
expect synth 0 "$RUN" synth --preset EURLex-4K --scale 0.02 --seed 3 --out data --json
contains synth-json synth.out '^\{.*"ok":true'
[ -s data/train.txt ] && [ -s data/test.txt ] && pass synth-files || fail synth-files
TEST_ROWS=$(head -n 1 data/test.txt | cut -d' ' -f1)
expect synth-again 0 "$RUN" synth --preset EURLex-4K --scale 0.02 --seed 3 --out data2
cmp -s data/train.txt data2/train.txt && pass synth-deterministic || fail synth-deterministic
# Names a user types match without regard to case (a preset also by the start
# of its name); what is printed back is the canonical spelling.
expect synth-any-case 0 "$RUN" synth --preset eurlex --scale 0.02 --seed 3 --out data3 --json
contains synth-any-case-canonical synth-any-case.out '^synth EURLex-4K at scale'
contains synth-any-case-json synth-any-case.out '"preset":"EURLex-4K"'
cmp -s data/train.txt data3/train.txt && pass synth-any-case-same || fail synth-any-case-same
expect synth-upper 0 "$RUN" synth --preset WIKI10-31K --scale 0.01 --seed 3 --out data4
contains synth-upper-canonical synth-upper.out '^synth Wiki10-31K at scale'
expect synth-ambiguous 1 "$RUN" synth --preset wiki --out data5
contains synth-ambiguous-message synth-ambiguous.err "'wiki' could be Wiki10-31K or Wiki-500K"
expect synth-unknown 1 "$RUN" synth --preset nosuch --out data5
contains synth-unknown-message synth-unknown.err "'nosuch' is not EURLex-4K, .* or Amazon-3M"

# --- train ---------------------------------------------------------------------
expect train 0 "$RUN" train --data data --ensemble 1 --epochs 2 --out m.pooch --log m.jsonl --json "${T[@]}"
json_last train.out > train.json
contains train-json train.json '^\{"command":"train".*"ok":true'
contains train-json-epochs train.json '"epoch":2,'
contains train-json-metrics train.json '"precision":\['
contains train-epoch-line train.out '^epoch 2/2 .*P@1/3/5 .*nDCG@1/3/5 .*PSP@1/3/5'
[ -s m.pooch ] && [ -s m.pooch.ckpt ] && pass train-files || fail train-files
contains train-log-step m.jsonl '^\{"type":"step"'
contains train-log-epoch m.jsonl '^\{"type":"epoch","epoch":2'

# A spec file (input width and labels from the data).
cat > spec.json <<'JSON'
{"layers": [{"type": "linear", "width": 64, "activation": "gelu"}, {"type": "layernorm"},
            {"type": "dropout", "p": 0.1}, {"type": "ffi", "fan_in": 16}],
 "loss": "squared-hinge"}
JSON
expect train-spec 0 "$RUN" train --data data --spec spec.json --epochs 1 --out s.pooch "${T[@]}"
expect bad-spec 2 "$RUN" train --data data --spec <(echo '{"layers": [{"type": "ffi"}]}') --out x.pooch "${T[@]}"
# Loss, optimizer, device and spec names in any case; the model keeps the canonical spelling.
expect train-any-case 0 "$RUN" train --data data --epochs 1 --loss BCE --optimizer AdamW \
  --device CPU --threads 1 --out case.pooch
expect info-any-case 0 "$RUN" info case.pooch
contains info-any-case-loss info-any-case.out '^  loss +bce$'
cat > spec-case.json <<'JSON'
{"layers": [{"type": "Linear", "width": 32, "activation": "GELU"}, {"type": "LayerNorm"},
            {"type": "FFI", "fan_in": 8}],
 "loss": "Squared-Hinge"}
JSON
expect train-spec-any-case 0 "$RUN" train --data data --spec spec-case.json --epochs 1 --out sc.pooch "${T[@]}"
expect info-spec-any-case 0 "$RUN" info sc.pooch
contains info-spec-any-case-names info-spec-any-case.out '0: linear 32, gelu$'
contains info-spec-any-case-loss info-spec-any-case.out '^  loss +squared-hinge$'
expect bad-loss 1 "$RUN" train --data data --loss hinge --out x.pooch "${T[@]}"
contains bad-loss-message bad-loss.err "'hinge' is not squared-hinge, bce or softmax"

# --- eval, predict, info ---------------------------------------------------------
expect eval 0 "$RUN" eval --model m.pooch --data data --json "${T[@]}"
contains eval-table eval.out '^P +[0-9.]+ +[0-9.]+'
contains eval-json eval.out '^\{"command":"eval".*"metrics":\{"rows":'"$TEST_ROWS"','

expect predict 0 "$RUN" predict --model m.pooch --input data/test.txt --k 3 --out preds.txt "${T[@]}"

# A fused-head model written before ffi_loss_grad could give the loss
# (tests/data/old_ffi_head.pooch, by the build of commit fcb333a: `train
# --data data --threads 1 --device cpu --hidden 16 --fan-in 4 --epochs 1` on
# this synth set): its stored graph has the op's three-output form, which a
# file is still read with; it evaluates, and trains on with today's step.
expect old-ffi-file-eval 0 "$RUN" eval --model "$TEST_DATA/old_ffi_head.pooch" --data data --json "${T[@]}"
contains old-ffi-file-eval-json old-ffi-file-eval.out '"metrics":\{"rows":'"$TEST_ROWS"','
expect old-ffi-file-finetune 0 "$RUN" finetune --model "$TEST_DATA/old_ffi_head.pooch" --data data --epochs 1 --out old-ft.pooch "${T[@]}"
expect old-ffi-file-finetuned-eval 0 "$RUN" eval --model old-ft.pooch --data data "${T[@]}"
[ "$(wc -l < preds.txt)" = "$TEST_ROWS" ] && pass predict-rows || fail "predict-rows: $(wc -l < preds.txt) lines, wanted $TEST_ROWS"
if awk 'NF != 3 { exit 1 } { for (i = 1; i <= NF; ++i) if ($i !~ /^[0-9]+:-?[0-9.e+-]+$/) exit 1 }' preds.txt; then
  pass predict-format
else
  fail predict-format
  head -3 preds.txt
fi
expect predict-stdout 0 "$RUN" predict --model m.pooch --input data/test.txt --k 2 "${T[@]}"
[ "$(wc -l < predict-stdout.out)" = "$TEST_ROWS" ] && pass predict-stdout-rows || fail predict-stdout-rows

expect info 0 "$RUN" info m.pooch
contains info-spec info.out '^model spec'
contains info-graph info.out '^graph: [0-9]+ ops'
contains info-tensors info.out '^tensors: [0-9]+ stored'
expect info-json 0 "$RUN" info m.pooch --json
contains info-json-last info-json.out '^\{"command":"info".*"xxh3"'

# --- finetune on a new label set ------------------------------------------------
expect finetune 0 "$RUN" finetune --model m.pooch --data data2 --new-head 120 --epochs 1 --out f.pooch --json "${T[@]}"
contains finetune-json finetune.out '"new_head":120'
expect info-finetuned 0 "$RUN" info f.pooch
contains finetune-head info-finetuned.out '^  labels +120$'
expect finetune-ckpt 0 "$RUN" finetune --model m.pooch.ckpt --data data --epochs 1 --out f2.pooch "${T[@]}"

# --- errors: bad input, budget, device ---------------------------------------------
printf '3 10 5\n1 0:1.0\n2,x 3:1.0\n0 1:2\n' > bad.txt
expect malformed 2 "$RUN" train --train bad.txt --test bad.txt --out x.pooch "${T[@]}"
contains malformed-where malformed.err 'bad\.txt.*line 3'
contains malformed-prefix malformed.err '^pooch-run: '
expect missing-data 2 "$RUN" train --data no-such-dir --out x.pooch --json "${T[@]}"
contains missing-data-json missing-data.out '^\{.*"ok":false.*"exit_code":2'
expect not-a-model 2 "$RUN" info bad.txt
: > empty.txt
expect empty-data 2 "$RUN" train --train empty.txt --out x.pooch "${T[@]}"
contains empty-data-message empty-data.err 'empty\.txt.*empty'
printf '2 10 5\n1 0:1.0\n9 3:1.0\n' > label-range.txt
expect label-range 2 "$RUN" train --train label-range.txt --out x.pooch "${T[@]}"
contains label-range-message label-range.err 'label-range\.txt: line 3.*label index 9 is out of range'
head -c 1000 m.pooch > trunc.pooch
expect truncated-model 2 "$RUN" predict --model trunc.pooch --input data/test.txt --out t.txt "${T[@]}"
contains truncated-message truncated-model.err 'trunc\.pooch: truncated'
[ ! -e t.txt ] && pass truncated-no-output || fail truncated-no-output
expect spec-typo 2 "$RUN" train --data data --out x.pooch "${T[@]}" \
  --spec <(echo '{"layers": [{"type": "linaer", "width": 8}, {"type": "ffi", "fan_in": 4}]}')
contains spec-typo-message spec-typo.err "layers\[0\]\.type 'linaer'"
expect bad-threads 2 "$RUN" eval --model m.pooch --data data --threads -1
contains bad-threads-message bad-threads.err '^pooch-run: --threads: -1 is out of range: use an integer from 0 to 1024'
expect bad-batch 2 "$RUN" predict --model m.pooch --input data/test.txt --batch 0
contains bad-batch-message bad-batch.err '^pooch-run: --batch: 0 is out of range: use an integer from 1 to 33554431'
expect not-a-number 1 "$RUN" predict --model m.pooch --input data/test.txt --batch many
expect big-k 1 "$RUN" predict --model m.pooch --input data/test.txt --k 999 --out big-k.txt "${T[@]}"
contains big-k-message big-k.err 'has only [0-9]+ labels'
[ ! -e big-k.txt ] && pass big-k-no-output || fail big-k-no-output
# A missing output directory fails before any training, not after an epoch.
expect no-out-dir 2 "$RUN" train --data data --out no-such-dir/m.pooch "${T[@]}"
contains no-out-dir-message no-out-dir.err "directory 'no-such-dir'.*does not exist"
if grep -q '^epoch' no-out-dir.out; then fail no-out-dir-early; else pass no-out-dir-early; fi
expect predict-no-out-dir 2 "$RUN" predict --model m.pooch --input data/test.txt --out no-such-dir/p.txt "${T[@]}"
expect budget 3 "$RUN" train --data data --device-memory 4K --out x.pooch "${T[@]}"
# The library states the least budget that fits; pooch-run names the flag that sets it.
contains budget-message budget.err 'a budget of at least [0-9]+ MiB'
contains budget-advice budget.err 'raise --device-memory to at least [0-9]+ MiB'
# The advice's figure (pooch_last_error_budget) is the message's.
said=$(grep -Eo 'a budget of at least [0-9]+' budget.err | grep -Eo '[0-9]+$' | tail -n 1)
advised=$(grep -Eo 'device-memory to at least [0-9]+' budget.err | grep -Eo '[0-9]+$')
[ -n "$said" ] && [ "$said" = "$advised" ] && pass budget-advice-figure ||
  fail "budget-advice-figure: the message says $said MiB, the advice $advised"
expect budget-keep 3 "$RUN" train --data data --device-memory 4K --strategy keep --out x.pooch "${T[@]}"

# --- out of core: a budget below the in-core step, the same model bit for bit ---
# A fixed fan-in model whose head is not fused with its loss, so that the
# step holds the [B, L] logits between the head and the loss: activations to
# swap or recompute. (The defaults for so small a set, a dense head and the
# skip path, and the fused fixed fan-in head leave too little of that.)
FFI=(--hidden 256 --fan-in 32 --skip off --dropout 0)
echo '{"layers": [{"type": "linear", "width": 256}, {"type": "ffi", "fan_in": 32}],
       "loss": "bce", "batch": 64, "fused_head": false}' > ooc-spec.json
expect ooc-in-core 0 "$RUN" train --data data --epochs 2 --out incore.pooch --json \
  --spec ooc-spec.json "${T[@]}"
IN_CORE=$(json_last ooc-in-core.out | grep -Eo '"arena_bytes":[0-9]+' | head -n 1 | cut -d: -f2)
WEIGHTS=0
for b in $(json_last ooc-in-core.out | grep -Eo '"(weight|optimizer)_bytes":[0-9]+' | cut -d: -f2); do
  WEIGHTS=$((WEIGHTS + b))
done
# Nine tenths of what the step holds beyond its weights and optimizer state
# (most of the rest is gradients, which stay on the device).
BUDGET=$(( WEIGHTS + (IN_CORE - WEIGHTS) * 9 / 10 ))
expect ooc-train 0 "$RUN" train --data data --epochs 2 --out ooc.pooch --device-memory "$BUDGET" \
  --strategy auto --link-bandwidth 1G --link-latency 0.00002 --json --spec ooc-spec.json "${T[@]}"
contains ooc-active ooc-train.out '"out_of_core":true'
cmp -s incore.pooch ooc.pooch && pass ooc-bit-identical || fail ooc-bit-identical
# Two thirds of the weights and optimizer state: no update fits on the device
# with its weight, gradient and Adam moments, so the updates run on the host.
HOST_BUDGET=$(( WEIGHTS * 2 / 3 ))
expect ooc-host-updates 0 "$RUN" train --data data --epochs 2 --out host.pooch \
  --device-memory "$HOST_BUDGET" --json --spec ooc-spec.json "${T[@]}"
contains ooc-host-updates-line ooc-host-updates.out '^out of core: [0-9]+ optimizer updates run on the host'
contains ooc-host-updates-json ooc-host-updates.out '"host_updates":[1-9]'
cmp -s incore.pooch host.pooch && pass ooc-host-bit-identical || fail ooc-host-bit-identical
expect ooc-bad-strategy 1 "$RUN" train --data data --strategy sometimes --out x.pooch "${T[@]}"
# The link latency is seconds, a fraction of one (it once took integers alone).
expect ooc-bad-latency 2 "$RUN" train --data data --link-latency -0.5 --out x.pooch "${T[@]}"
contains ooc-bad-latency-says ooc-bad-latency.err '^pooch-run: --link-latency: -0.5 is out of range: use a number from 0 to 1$'

# --- plan and profile ------------------------------------------------------------
# The in-core arena of the model's step and its weights and optimizer state
# (from info's plan), and a budget below the arena: the plan goes out of core.
expect plan-info 0 "$RUN" info incore.pooch --no-ops --json
P_IN=$(json_last plan-info.out | grep -Eo '"arena_bytes":[0-9]+' | head -n 1 | cut -d: -f2)
P_W=0
for b in $(json_last plan-info.out | grep -Eo '"(weight|optimizer)_bytes":[0-9]+' | cut -d: -f2); do
  P_W=$((P_W + b))
done
P_BUDGET=$(( P_W + (P_IN - P_W) * 9 / 10 ))
expect plan 0 "$RUN" plan --model incore.pooch --device-memory "$P_BUDGET" --svg step.svg --json "${T[@]}"
# auto (the default) names itself, and the strategy whose plan it kept.
contains plan-out-of-core plan.out '^  out of core +strategy auto(, [a-z-]+.s plan)? \('
contains plan-decisions plan.out 'saved activations [0-9]+: keep .*(swap [1-9]|recompute [1-9])'
contains plan-table plan.out '^  activation or gradient +bytes +decision'
contains plan-table-row plan.out ' (swap|recompute) +[0-9]+ +[0-9]+ +[0-9]+$'
contains plan-json plan.out '^\{"command":"plan".*"plan":\{.*"out_of_core":true'
for k in strategy in_core_arena arena host_pool predicted_seconds predicted_in_core_seconds \
  activations decision producer first_backward steps occupancy; do
  contains "plan-json-$k" plan.out "\"$k\":"
done
if head -c 100 step.svg | grep -Eq '^(<svg|<\?xml)'; then pass plan-svg; else fail plan-svg; fi
contains plan-svg-lanes step.svg 'host → device'
ls step.svg.tmp-* > /dev/null 2>&1 && fail plan-svg-no-temporary || pass plan-svg-no-temporary
expect plan-in-core 0 "$RUN" plan --model incore.pooch "${T[@]}"
contains plan-in-core-fits plan-in-core.out '^  fits in core'
expect plan-too-small 3 "$RUN" plan --model incore.pooch --device-memory 4K "${T[@]}"
contains plan-too-small-advice plan-too-small.err 'raise --device-memory to at least [0-9]+ MiB'
expect plan-no-model 1 "$RUN" plan --device-memory 1M "${T[@]}"
expect plan-svg-no-dir 2 "$RUN" plan --model incore.pooch --svg no-such-dir/s.svg "${T[@]}"
# --machine: plan for a card described in machines/*.json; a strict reader.
expect plan-machine 0 "$RUN" plan --model incore.pooch --machine "$MACHINES/gtx1650.json" \
  --json "${T[@]}"
contains plan-machine-name plan-machine.out '^  machine +NVIDIA GeForce GTX 1650'
contains plan-machine-fits plan-machine.out '^  fits +yes: device [0-9.]+ [KM]iB, host'
contains plan-machine-json plan-machine.out '"fits":true.*"machine":\{"name":"NVIDIA GeForce GTX 1650'
grep -v '"flops"' "$MACHINES/gtx1650.json" > no-flops.json
expect plan-machine-missing 2 "$RUN" plan --model incore.pooch --machine no-flops.json "${T[@]}"
contains plan-machine-missing-names plan-machine-missing.err "no-flops.json: missing field 'flops'"
sed 's/"link_latency": 10e-6/"link_latency": -1/' "$MACHINES/gtx1650.json" > negative.json
expect plan-machine-negative 2 "$RUN" plan --model incore.pooch --machine negative.json "${T[@]}"
contains plan-machine-negative-names plan-machine-negative.err "negative.json: field 'link_latency' is -1"
expect plan-machine-absent 2 "$RUN" plan --model incore.pooch --machine no-such.json "${T[@]}"
# mlp and CNN specs are complete as they are: plan takes them without data
# (it once added an xmc "labels" field, which they refuse).
cat > plan-mlp.json <<'JSON'
{"family": "MLP", "input": {"width": 64}, "outputs": 10, "loss": "softmax",
 "layers": [{"type": "linear", "width": 128, "activation": "relu"},
            {"type": "linear", "width": 128, "activation": "relu"}, {"type": "dense"}]}
JSON
expect plan-spec-mlp 0 "$RUN" plan --spec plan-mlp.json --batch 32 --machine "$MACHINES/gtx1650.json" \
  --json "${T[@]}"
contains plan-spec-mlp-family plan-spec-mlp.out '^plan of a train step of plan-mlp.json \(mlp,'
contains plan-spec-mlp-fits plan-spec-mlp.out '"fits":true'
cat > plan-resnet.json <<'JSON'
{"family": "resnet", "depth": 18, "width": 2, "input": {"channels": 3, "height": 16, "width": 16},
 "classes": 5, "batch": 4}
JSON
expect plan-spec-resnet 0 "$RUN" plan --spec plan-resnet.json --device-memory 64M --json "${T[@]}"
contains plan-spec-resnet-family plan-spec-resnet.out '^plan of a train step of plan-resnet.json \(resnet, adam,'
# --optimizer sgd plans train --optimizer sgd's step: one momentum tensor a
# weight where Adam keeps two, so a smaller in-core arena.
expect plan-spec-resnet-sgd 0 "$RUN" plan --spec plan-resnet.json --device-memory 64M --optimizer sgd \
  --json "${T[@]}"
contains plan-spec-resnet-sgd-named plan-spec-resnet-sgd.out '^plan of a train step of plan-resnet.json \(resnet, sgd,'
contains plan-spec-resnet-sgd-json plan-spec-resnet-sgd.out '"optimizer":"sgd"'
ARENA_ADAM=$(json_last plan-spec-resnet.out | grep -Eo '"in_core_arena":[0-9]+' | cut -d: -f2)
ARENA_SGD=$(json_last plan-spec-resnet-sgd.out | grep -Eo '"in_core_arena":[0-9]+' | cut -d: -f2)
if [ -n "$ARENA_SGD" ] && [ -n "$ARENA_ADAM" ] && [ "$ARENA_SGD" -lt "$ARENA_ADAM" ]; then
  pass plan-spec-resnet-sgd-smaller
else
  fail "plan-spec-resnet-sgd-smaller (sgd ${ARENA_SGD:-?} against adam ${ARENA_ADAM:-?} bytes)"
fi
expect plan-optimizer-unknown 1 "$RUN" plan --spec plan-resnet.json --optimizer rmsprop "${T[@]}"
printf '{"family": "mlp", "outputs": 2, "outputs": 3, "input": {"width": 4}, "layers": []}' \
  > plan-mlp-twice.json
expect plan-spec-repeated 2 "$RUN" plan --spec plan-mlp-twice.json "${T[@]}"
contains plan-spec-repeated-names plan-spec-repeated.err 'the key "outputs" appears twice'
expect profile 0 "$RUN" profile --model incore.pooch --data data --json "${T[@]}"
contains profile-header profile.out '^  op +calls +ms +GFLOP/s'
contains profile-linear profile.out '^  [a-z_]*linear +[0-9]+ +[0-9.]+ '
contains profile-json profile.out '"profile":\{.*"ops":\[\{"op":'
contains profile-adam profile.out '^  adam_update'
# --optimizer: the step train --optimizer sgd runs, its updates SGD's.
expect profile-sgd 0 "$RUN" profile --model incore.pooch --data data --optimizer sgd --json "${T[@]}"
contains profile-sgd-updates profile-sgd.out '^  sgd_update'
contains profile-sgd-json profile-sgd.out '"optimizer":"sgd"'
"$RUN" train --data data --epochs 1 --device cuda --out cuda.pooch --threads 1 > cuda.out 2> cuda.err
rc=$?
if [ $rc = 0 ]; then
  pass "device-cuda (a GPU is present: trained on it)"
elif grep -Eqi 'cuda|gpu|device' cuda.err; then
  pass "device-cuda (exit $rc without a GPU, with a message)"
  # The advice is pooch-run's, and it is given once.
  n=$(grep -o 'use --device cpu or auto' cuda.err | wc -l)
  [ "$n" = 1 ] && pass device-cuda-advice || { fail "device-cuda-advice: $n times"; cat cuda.err; }
else
  fail "device-cuda: exit $rc without a clear message"
  cat cuda.err
fi

# --- dense models (the mlp family) from .npy ------------------------------------
# npy FILE DESCR SHAPE DATA_BYTES: a version 1.0 .npy header written here (not
# by pooch) and DATA_BYTES zero bytes of data.
npy() {
  local h="{'descr': '$2', 'fortran_order': False, 'shape': $3, }"
  local pad=$(((64 - (10 + ${#h} + 1) % 64) % 64))
  h="$h$(printf '%*s' "$pad" '')"
  local n=$((${#h} + 1))
  {
    printf '\223NUMPY\001\000'
    printf "\\$(printf %03o $((n % 256)))\\$(printf %03o $((n / 256)))"
    printf '%s\n' "$h"
    head -c "$4" /dev/zero
  } > "$1"
}
# epoch_field FILE EPOCH N: field N of the line "epoch E/M  loss X  valid loss Y ...".
epoch_field() { grep -E "^epoch $2/[0-9]+  loss " "$1" | awk -v n="$3" '{ print $n }'; }
less_than_half() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "" && b != "" && b < 0.5 * a) }'; }

expect synth-regression 0 "$RUN" synth --kind regression --rows 600 --features 6 --seed 5 --out reg --json
contains synth-regression-json synth-regression.out '^\{"command":"synth","kind":"regression".*"ok":true'
# 600 × 6 float32 and 600 × 2 float32 after a 128-byte header.
[ "$(wc -c < reg/X.npy)" = 14528 ] && [ "$(wc -c < reg/Y.npy)" = 4928 ] && pass synth-regression-files ||
  fail "synth-regression-files: $(wc -c < reg/X.npy) and $(wc -c < reg/Y.npy) bytes"
expect synth-classification 0 "$RUN" synth --kind classification --rows 800 --features 4 --outputs 3 --out cls
contains synth-classification-classes synth-classification.out 'class ids in \[0, 3\)'
expect synth-wrong-kind-flag 1 "$RUN" synth --kind regression --preset Wiki10-31K --out reg2
contains synth-wrong-kind-flag-message synth-wrong-kind-flag.err '^pooch-run: --preset: applies to --kind xmc'

# Regression from a spec (input width and outputs from the data); 540
# training rows in batches of 32 end with a partial batch.
cat > mlp.json <<'JSON'
{"family": "mlp", "layers": [{"type": "linear", "width": 32, "activation": "relu"}, {"type": "dense"}],
 "loss": "mse", "batch": 32}
JSON
expect train-mlp 0 "$RUN" train --spec mlp.json --data reg/X.npy --targets reg/Y.npy --epochs 8 --lr 0.01 \
  --out mlp.pooch --log mlp.jsonl --json "${T[@]}"
contains train-mlp-split train-mlp.out '^split: 540 rows to train on, 60 held out'
contains train-mlp-json train-mlp.out '^\{"command":"train".*"family":"mlp".*"valid":\{"rows":60,"loss":.*"ok":true'
contains train-mlp-log mlp.jsonl '^\{"type":"epoch","epoch":8,'
if less_than_half "$(epoch_field train-mlp.out 1 4)" "$(epoch_field train-mlp.out 8 4)"; then
  pass train-mlp-loss-falls
else
  fail "train-mlp-loss-falls: $(epoch_field train-mlp.out 1 4) -> $(epoch_field train-mlp.out 8 4)"
fi
if less_than_half "$(epoch_field train-mlp.out 1 7)" "$(epoch_field train-mlp.out 8 7)"; then
  pass train-mlp-valid-loss-falls
else
  fail "train-mlp-valid-loss-falls: $(epoch_field train-mlp.out 1 7) -> $(epoch_field train-mlp.out 8 7)"
fi

# Early stopping writes the epoch whose validation loss was the lowest, not
# the last (120 rows, 12 held out, a wide layer: the held-out loss rises
# after a few epochs): the same bits as a run of just that many epochs.
expect synth-small 0 "$RUN" synth --kind classification --rows 120 --features 4 --outputs 3 --out cls120
expect train-best 0 "$RUN" train --data cls120/X.npy --targets cls120/Y.npy --hidden 256 --epochs 300 \
  --lr 0.05 --out best.pooch --json "${T[@]}"
best_epoch=$(json_last train-best.out | grep -Eo '"written_epoch": ?[0-9]+' | grep -Eo '[0-9]+$')
last_epoch=$(grep -Ec '^epoch [0-9]+/300  loss ' train-best.out)
if [ -n "$best_epoch" ] && [ "$best_epoch" -lt "$last_epoch" ]; then
  pass "train-best: epoch $best_epoch written of $last_epoch"
else
  fail "train-best: written epoch '$best_epoch', last epoch '$last_epoch'"
fi
contains train-best-message train-best.out \
  "^model written to best\.pooch: the weights of epoch $best_epoch, whose validation loss was the lowest"
expect train-upto-best 0 "$RUN" train --data cls120/X.npy --targets cls120/Y.npy --hidden 256 \
  --epochs "${best_epoch:-1}" --early-stop 0 --lr 0.05 --out upto.pooch "${T[@]}"
if cmp -s best.pooch upto.pooch; then pass train-best-is-that-epoch; else fail train-best-is-that-epoch; fi
# Without early stopping the last epoch is written, improved or not.
expect train-no-stop 0 "$RUN" train --data cls120/X.npy --targets cls120/Y.npy --hidden 256 \
  --epochs "$last_epoch" --early-stop 0 --lr 0.05 --out last.pooch "${T[@]}"
if ! cmp -s best.pooch last.pooch; then pass train-no-stop-writes-the-last; else
  fail train-no-stop-writes-the-last; fi

# The same for bag-of-words data (early stopping on held-out rows, scored by
# P@3; a constant, large rate makes the score go up and down): the file is
# the best epoch's, byte for byte a run of just that many epochs, and the
# test set's figures are that epoch's.
expect synth-bow 0 "$RUN" synth --preset EURLex-4K --scale 0.05 --seed 3 --out bow
BOW_STOP=(--data bow --early-stop 2 --valid-fraction 0.2 --lr 0.5 --lr-schedule constant)
BOW=("${BOW_STOP[@]}" --ensemble 1)
expect train-bow-best 0 "$RUN" train "${BOW[@]}" --epochs 12 --out bowbest.pooch --json "${T[@]}"
bow_best=$(json_last train-bow-best.out | grep -Eo '"written_epoch": ?[0-9]+' | grep -Eo '[0-9]+$')
bow_last=$(grep -Ec '^epoch [0-9]+/12  loss ' train-bow-best.out)
if [ -n "$bow_best" ] && [ "$bow_best" -lt "$bow_last" ]; then
  pass "train-bow-best: epoch $bow_best written of $bow_last"
else
  fail "train-bow-best: written epoch '$bow_best', last epoch '$bow_last'"
fi
contains train-bow-best-message train-bow-best.out \
  "^model written to bowbest\.pooch: the weights of epoch $bow_best, whose validation score was the best"
expect train-bow-upto 0 "$RUN" train "${BOW[@]}" --epochs "${bow_best:-1}" --out bowupto.pooch --json \
  "${T[@]}"
if cmp -s bowbest.pooch bowupto.pooch; then pass train-bow-best-is-that-epoch; else
  fail train-bow-best-is-that-epoch; fi
p_at_1() { json_last "$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)["final"]["precision"][0])'; }
p_best=$(p_at_1 train-bow-best.out)
p_upto=$(p_at_1 train-bow-upto.out)
if [ -n "$p_best" ] && [ "$p_best" = "$p_upto" ]; then pass "train-bow-best-final ($p_best)"; else
  fail "train-bow-best-final: P@1 '$p_best' against that epoch's '$p_upto'"; fi
# An ensemble's members stop early the same way and are merged from their
# best epochs: member 1 (the same seed and held-out rows as the run above) is
# judged on the test set with epoch $bow_best's weights, not its last.
expect train-bow-ens-best 0 "$RUN" train "${BOW_STOP[@]}" --ensemble 2 --epochs 12 \
  --out bowens.pooch --json "${T[@]}"
m1=$(json_last train-bow-ens-best.out | python3 -c \
  'import json, sys; m = json.load(sys.stdin)["members"][0]; print(m["kept_epoch"], m["final"]["precision"][0])')
if [ "$m1" = "$bow_best $p_upto" ]; then pass "train-bow-ens-best (member 1: $m1)"; else
  fail "train-bow-ens-best: member 1's kept epoch and P@1 '$m1', the single run's '$bow_best $p_upto'"; fi

# Classification from the model flags (softmax, as the targets are class ids).
expect train-cls 0 "$RUN" train --data cls/X.npy --targets cls/Y.npy --hidden 32 --batch 50 --epochs 10 \
  --lr 0.01 --out cls.pooch "${T[@]}"
acc=$(epoch_field train-cls.out 10 9)
if awk -v a="${acc%\%}" 'BEGIN { exit !(a != "" && a > 70) }'; then pass "train-cls-accuracy ($acc)"; else
  fail "train-cls-accuracy: $acc"
fi
less_than_half "$(epoch_field train-cls.out 1 4)" "$(epoch_field train-cls.out 10 4)" &&
  pass train-cls-loss-falls || fail train-cls-loss-falls

expect profile-mlp 0 "$RUN" profile --model mlp.pooch --data reg/X.npy --targets reg/Y.npy "${T[@]}"
contains profile-mlp-linear profile-mlp.out '^  linear +[0-9]+ '
expect info-mlp 0 "$RUN" info mlp.pooch --no-ops
contains info-mlp-family info-mlp.out '^model: mlp, 290 parameters'
contains info-mlp-input info-mlp.out '^    batch\.x +f32 +\[batch×6\] +batch 32'
contains info-mlp-target info-mlp.out '^    batch\.y +f32 +\[batch×2\]'
contains info-mlp-output info-mlp.out '^    prediction +f32 +\[batch×2\]'
contains info-mlp-plan info-mlp.out '^  plan of a training step on the cpu backend: arena '
expect info-mlp-json 0 "$RUN" info mlp.pooch --json
contains info-mlp-json-io info-mlp-json.out '"model":\{"family":"mlp","inputs":\[\{"name":"batch\.x","dtype":"f32","shape":\[-1,6\],"max_rows":32'
contains info-mlp-json-memory info-mlp-json.out '"memory":\{"backend":"cpu","arena_bytes":[1-9]'
expect info-xmc-model 0 "$RUN" info m.pooch --no-ops
contains info-xmc-inputs info-xmc-model.out '^model: xmc, [0-9]+ parameters'

expect eval-mlp 0 "$RUN" eval --model mlp.pooch --data reg/X.npy --targets reg/Y.npy --json "${T[@]}"
contains eval-mlp-json eval-mlp.out '"metrics":\{"rows":600,"loss":[0-9]'
expect eval-cls 0 "$RUN" eval --model cls.pooch --data cls/X.npy --targets cls/Y.npy "${T[@]}"
contains eval-cls-accuracy eval-cls.out '^800 rows in .*accuracy [0-9.]+%'
expect predict-mlp 0 "$RUN" predict --model mlp.pooch --data reg/X.npy --out P.npy "${T[@]}"
[ "$(wc -c < P.npy)" = 4928 ] && pass predict-mlp-size || fail "predict-mlp-size: $(wc -c < P.npy) bytes"
[ "$(head -c 6 P.npy | od -An -c | tr -d ' ')" = '223NUMPY' ] && pass predict-mlp-magic || fail predict-mlp-magic
# An array written here, not by pooch: zeros, 10 rows of 6 float32.
npy zeros.npy '<f4' '(10, 6)' 240
expect predict-mlp-stdout 0 "$RUN" predict --model mlp.pooch --data zeros.npy "${T[@]}"
[ "$(awk 'NF == 2' predict-mlp-stdout.out | wc -l)" = 10 ] && pass predict-mlp-stdout-rows ||
  fail predict-mlp-stdout-rows
# float64 rows and int64 class ids (NumPy's defaults) are read too.
npy zeros8.npy '<f8' '(10, 4)' 320
npy ids8.npy '<i8' '(10,)' 80
expect eval-f8-i8 0 "$RUN" eval --model cls.pooch --data zeros8.npy --targets ids8.npy "${T[@]}"
contains eval-f8-i8-rows eval-f8-i8.out '^10 rows in .*accuracy'
expect train-mlp-stopped 0 "$RUN" train --spec mlp.json --data reg/X.npy --targets reg/Y.npy --max-steps 3 \
  --out stopped.pooch "${T[@]}"
[ -s stopped.pooch ] && pass train-mlp-stopped-model || fail train-mlp-stopped-model

# Malformed and mismatched dense data: exit 2 naming the file.
npy short.npy '<f4' '(10, 6)' 8
expect npy-truncated 2 "$RUN" train --data short.npy --targets reg/Y.npy --out x.pooch "${T[@]}"
contains npy-truncated-message npy-truncated.err '^pooch-run: --data: short\.npy: truncated: the shape \(10, 6\) of float32 needs 240 bytes'
npy big.npy '>f4' '(10, 6)' 240
expect npy-big-endian 2 "$RUN" predict --model mlp.pooch --data big.npy "${T[@]}"
contains npy-big-endian-message npy-big-endian.err 'big\.npy: the data is big-endian'
printf 'not an array' > text.npy
expect npy-not-npy 2 "$RUN" train --data reg/X.npy --targets text.npy --out x.pooch "${T[@]}"
contains npy-not-npy-message npy-not-npy.err '^pooch-run: --targets: text\.npy: not a NumPy \.npy file'
expect npy-rows 2 "$RUN" train --data reg/X.npy --targets cls/Y.npy --out x.pooch "${T[@]}"
contains npy-rows-message npy-rows.err 'cls/Y\.npy has 800 rows, but reg/X\.npy has 600'
expect mlp-width 2 "$RUN" predict --model mlp.pooch --data cls/X.npy "${T[@]}"
contains mlp-width-message mlp-width.err 'cls/X\.npy has 4 features, but mlp\.pooch takes 6'
expect mlp-no-targets 1 "$RUN" train --data reg/X.npy --out x.pooch "${T[@]}"
contains mlp-no-targets-message mlp-no-targets.err '--targets Y\.npy'
expect mlp-xmc-flag 1 "$RUN" train --data reg/X.npy --targets reg/Y.npy --warmup-steps 10 --out x.pooch "${T[@]}"
[ ! -e x.pooch ] && pass dense-errors-no-model || fail dense-errors-no-model
expect mlp-budget 3 "$RUN" train --data reg/X.npy --targets reg/Y.npy --device-memory 4K --out x.pooch "${T[@]}"
contains mlp-budget-message mlp-budget.err '^pooch-run: session: '

# Ctrl-C stops a dense run after the step in progress and writes the model so far.
"$RUN" train --spec mlp.json --data reg/X.npy --targets reg/Y.npy --epochs 1000000 --early-stop 0 \
  --out mlp-int.pooch "${T[@]}" > mlp-int.out 2> mlp-int.err &
pid=$!
for _ in $(seq 1 600); do
  grep -q '^epoch 2/' mlp-int.out 2> /dev/null && break
  sleep 0.1
done
kill -INT $pid
wait $pid
rc=$?
[ $rc = 130 ] && pass "mlp-sigint (exit $rc)" || { fail "mlp-sigint: exit $rc, wanted 130"; tail -3 mlp-int.err; }
contains mlp-sigint-message mlp-int.out '^interrupted at step [0-9]+'
[ -s mlp-int.pooch ] && pass mlp-sigint-model || fail mlp-sigint-model

# --- interrupting and resuming ------------------------------------------------------
# Uninterrupted reference run, then the same run stopped after 7 steps (as
# Ctrl-C stops it) and resumed from its checkpoint: the models must be equal.
expect ref 0 "$RUN" train --data data --ensemble 1 --epochs 3 --seed 7 --out ref.pooch "${T[@]}"
expect stopped 0 "$RUN" train --data data --ensemble 1 --epochs 3 --seed 7 --out res.pooch --max-steps 7 "${T[@]}"
contains stopped-hint stopped.out '^resume with: pooch-run train .*--resume res\.pooch\.ckpt'
[ ! -e res.pooch ] && pass stopped-no-model || fail stopped-no-model
expect resumed 0 "$RUN" train --data data --ensemble 1 --epochs 3 --seed 7 --out res.pooch --resume res.pooch.ckpt "${T[@]}"
if cmp ref.pooch res.pooch; then pass resume-bit-exact; else fail resume-bit-exact; fi

# Ctrl-C: SIGINT during a long run writes the checkpoint and exits with 130.
"$RUN" train --data data --ensemble 1 --epochs 100000 --early-stop 0 --plateau-patience 0 --out int.pooch "${T[@]}" \
  > int.out 2> int.err &
pid=$!
for _ in $(seq 1 600); do
  grep -q '^epoch 1/' int.out 2> /dev/null && break
  sleep 0.1
done
# pooch owns its threads: with --threads 1 the process runs its main thread
# and the backend's three stream threads (compute, copy in, copy out); no
# OpenBLAS worker pool (OpenBLAS starts one on load, sized by the cores) and
# no OpenMP team.
if [ -d "/proc/$pid/task" ]; then
  n=$(ls "/proc/$pid/task" | wc -l)
  [ "$n" = 4 ] && pass "threads-1 ($n threads)" || fail "threads-1: $n threads, wanted 4"
fi
# It runs with the settings that keep libgomp's and OpenBLAS's threads from
# spinning (set by its own re-exec from its preinit array; docs/RELIABILITY.md).
if [ -r "/proc/$pid/environ" ]; then
  env_of=$(tr '\0' '\n' < "/proc/$pid/environ")
  for kv in OMP_WAIT_POLICY=passive OPENBLAS_THREAD_TIMEOUT=4 OPENBLAS_NUM_THREADS=1; do
    if grep -qx "$kv" <<< "$env_of"; then pass "no-spin $kv"; else fail "no-spin: $kv not set"; fi
  done
fi
# ... and libgomp read it in its initialiser (it prints what it read when
# OMP_DISPLAY_ENV is set), so the setting was there before the library started.
OMP_DISPLAY_ENV=true "$RUN" --version > display-env.out 2>&1
contains no-spin-libgomp display-env.out "OMP_WAIT_POLICY = 'PASSIVE'"
kill -INT $pid
wait $pid
rc=$?
[ $rc = 130 ] && pass "sigint (exit $rc)" || { fail "sigint: exit $rc, wanted 130"; tail -3 int.err; }
contains sigint-message int.out '^interrupted at step [0-9]+'
contains sigint-hint int.out '^resume with: .*--resume int\.pooch\.ckpt'
[ -s int.pooch.ckpt ] && pass sigint-checkpoint || fail sigint-checkpoint
expect sigint-resume 0 "$RUN" train --data data --ensemble 1 --epochs 1 --out int2.pooch --resume int.pooch.ckpt "${T[@]}"

# --- hostile input and limits (issue 12) ----------------------------------------------
# Every numeric flag is range-checked before any work: exit 2 naming the flag
# and the range (not an epoch trained and then lost).
expect range-lr 2 "$RUN" train --data data --lr 1e30 --out r.pooch "${T[@]}"
contains range-lr-message range-lr.err '^pooch-run: --lr: 1e30 is out of range: use a number above 0 and at most 1000000'
if grep -q '^epoch' range-lr.out; then fail range-lr-early; else pass range-lr-early; fi
expect range-dropout 2 "$RUN" train --data data --dropout nan --out r.pooch "${T[@]}"
contains range-dropout-message range-dropout.err '^pooch-run: --dropout: nan is out of range: use a number from 0 to 0.999'
expect range-seed 2 "$RUN" train --data data --seed -1 --out r.pooch "${T[@]}"
contains range-seed-message range-seed.err '^pooch-run: --seed: -1 is out of range: use an integer from 0 to 18446744073709551615'
expect range-batch 2 "$RUN" train --data data --batch 100000000 --out r.pooch "${T[@]}"
contains range-batch-message range-batch.err '^pooch-run: --batch: 100000000 is out of range: use an integer from 1 to 33554431'
expect range-plateau 2 "$RUN" train --data data --plateau-factor inf --out r.pooch "${T[@]}"
expect range-scale 2 "$RUN" synth --scale 1e300 --out big
expect range-propensity 2 "$RUN" train --data data --propensity 0.5,-2 --out r.pooch "${T[@]}"
contains range-propensity-message range-propensity.err '^pooch-run: --propensity: .* out of range'
if grep -q '^train:' range-propensity.out; then fail range-propensity-early; else pass range-propensity-early; fi
expect range-crop-pad 2 "$RUN" train --data data --crop-pad 70000 --out r.pooch "${T[@]}"
contains range-crop-pad-message range-crop-pad.err '^pooch-run: --crop-pad: 70000 is out of range: use an integer from 0 to 65536'
expect range-valid-fraction 2 "$RUN" train --data data --valid-fraction 0.95 --out r.pooch "${T[@]}"
expect range-import-depth 2 "$RUN" import --from nothing.safetensors --depth 0 --out r.pooch
expect range-import-batch 2 "$RUN" import --from nothing.safetensors --batch 100000000 --out r.pooch
# ... and so is every numeric spec field, naming it and the largest value allowed.
spec_case() {  # NAME SPEC-JSON REGEX
  echo "$2" > "$1.json"
  expect "$1" 2 "$RUN" train --data data --spec "$1.json" --out r.pooch "${T[@]}"
  contains "$1-message" "$1.err" "$3"
}
spec_case spec-width '{"layers": [{"type": "linear", "width": 1099511627776}, {"type": "ffi", "fan_in": 4}]}' \
  'layers\[0\]\.width is 1099511627776; it must be from 1 to 2147483647'
spec_case spec-batch '{"layers": [{"type": "linear", "width": 8}, {"type": "ffi", "fan_in": 4}], "batch": 4294967297}' \
  'batch is 4294967297; it must be from 1 to 33554431'
spec_case spec-topk '{"layers": [{"type": "linear", "width": 8}, {"type": "dense"}], "topk": 4294967297}' \
  'topk is 4294967297; it must be from 1 to 2147483647'
spec_case spec-seed '{"layers": [{"type": "linear", "width": 8}, {"type": "dense"}], "seed": -1}' \
  'seed is -1; it must be from 0 to'
spec_case spec-fan-in '{"labels": 2147483647, "input": {"width": 100}, "layers": [{"type": "linear", "width": 70000}, {"type": "ffi", "fan_in": 65536}]}' \
  'fan_in is 65536: .*fan_in can be at most 1'
# A key given twice is an error, as an unknown one is.
spec_case spec-dup '{"layers": [{"type": "linear", "width": 8}, {"type": "dense"}], "loss": "bce", "loss": "softmax"}' \
  'the key "loss" appears twice'
spec_case spec-dup-layer '{"layers": [{"type": "linear", "width": 8, "width": 9}, {"type": "dense"}]}' \
  'the key "width" appears twice'

# Data headers past the limits are bad input naming the file and the field.
printf '1 10 2147483647\n0 1:1\n' > big-labels.txt
expect data-labels 2 "$RUN" train --train big-labels.txt --out r.pooch "${T[@]}"
contains data-labels-message data-labels.err 'labels from big-labels\.txt\).*2147483647 labels x 32 inputs.*fan_in can be at most 1$'

# What is not a regular file is refused before it is opened for reading (a
# FIFO would block open() for ever, /dev/zero fill the memory), naming it.
mkfifo fifo.txt
expect fifo-train 2 timeout -s KILL 60 "$RUN" train --train fifo.txt --out r.pooch "${T[@]}"
contains fifo-train-message fifo-train.err "fifo\.txt.*a FIFO"
expect fifo-info 2 timeout -s KILL 60 "$RUN" info fifo.txt
contains fifo-info-message fifo-info.err "fifo\.txt.*a FIFO"
expect dev-zero 2 timeout -s KILL 60 "$RUN" train --train /dev/zero --out r.pooch "${T[@]}"
contains dev-zero-message dev-zero.err "/dev/zero.*a character device"
expect dir-train 2 "$RUN" train --train data --out r.pooch "${T[@]}"
contains dir-train-message dir-train.err "'data'.*a directory"
if [ -r /proc/self/status ]; then
  expect proc-file 2 "$RUN" train --train /proc/self/status --out r.pooch "${T[@]}"
  contains proc-file-message proc-file.err "size the system does not report"
fi

# (info on a file whose stored spec is not JSON, and a checkpoint without
# its trainer state: tests/unit/test_cli_files.cpp, which writes such files.)

# A checkpoint write killed half way leaves a temporary file; the next write
# to the same path removes those of processes that are gone, and says so.
dead=$(sh -c 'echo $$')  # a process that has ended
echo partial > "stale.pooch.ckpt.tmp-$dead-0"
echo live > "stale.pooch.ckpt.tmp-$$-0"
expect stale 0 "$RUN" train --data data --ensemble 1 --epochs 1 --out stale.pooch "${T[@]}"
[ ! -e "stale.pooch.ckpt.tmp-$dead-0" ] && pass stale-removed || fail stale-removed
[ -e "stale.pooch.ckpt.tmp-$$-0" ] && pass stale-live-kept || fail stale-live-kept
contains stale-message stale.err "removed 1 temporary file of 'stale\.pooch\.ckpt' left by a process that no longer exists"

# Under an address-space limit a run ends (done, or out of memory: exit 3
# with a message that honours the limit); it never hangs at exit. --threads 1
# starts no OpenBLAS worker that could spin there. The fixed fan-in model: a
# dense output layer (the default on so small a set) calls OpenBLAS, which
# does not return under the smaller limits (docs/BENCHMARKS.md, issue 11).
# (AddressSanitizer reserves terabytes of address space: no ulimit -v there.)
# At 100 MB OpenBLAS's worker pool, which its initialiser starts before main,
# would not fit (it printed why and exited 130): pooch-run runs itself again
# from its preinit array, before any library initialiser, so that the pool is
# never started (docs/RELIABILITY.md). Below about 95 MB the loader itself
# cannot map the libraries (exit 127, before any pooch code).
ULIMITS="100000 150000 200000 250000"
# (gcc links the sanitizer's library, clang puts its runtime in the program:
# either way the program names __asan_init or __tsan_init.)
if grep -aqE '__(a|t)san_init' "$RUN"; then
  ULIMITS=""
  echo "skip ulimit (a sanitizer build)"
fi
for lim in $ULIMITS; do
  ( ulimit -v $lim && exec timeout -s KILL 120 "$RUN" train --data data --epochs 1 --threads 1 \
      --device cpu --out "ulimit-$lim.pooch" "${FFI[@]}" ) > "ulimit-$lim.out" 2> "ulimit-$lim.err"
  rc=$?
  if [ $rc = 0 ]; then
    pass "ulimit-$lim (exit 0)"
  elif [ $rc = 3 ] && grep -q 'MiB' "ulimit-$lim.err"; then
    avail=$(grep -o '[0-9.]* MiB are available' "ulimit-$lim.err" | head -n 1 | cut -d' ' -f1)
    if [ -z "$avail" ] || awk -v a="$avail" -v l="$lim" 'BEGIN { exit !(a * 1024 <= l) }'; then
      pass "ulimit-$lim (exit 3: out of memory, with a message)"
    else
      fail "ulimit-$lim: $avail MiB said to be available under a limit of $lim KiB"
    fi
  else
    fail "ulimit-$lim: exit $rc (137: it hung and was killed)"
    tail -3 "ulimit-$lim.err"
  fi
done

# --- ensembles, the cosine schedule, the validation split -----------------------
# --ensemble 2 writes one ordinary model, twice as wide, whose scores are the
# mean of its members' scores: the two models trained alone with the same
# seeds (member i has seed --seed + i) give, averaged, the ensemble's scores.
# With the skip path on (off by default), whose weights the merge averages.
ENS=(--data data --epochs 2 --hidden 16 --fan-in 0 --skip on --plateau-patience 0 --early-stop 0)
NLAB=$(head -n 1 data/train.txt | cut -d' ' -f3)
[ "$NLAB" -gt 1000 ] && NLAB=1000
expect ens-train 0 "$RUN" train "${ENS[@]}" --ensemble 2 --seed 5 --out ens.pooch --json "${T[@]}"
contains ens-json ens-train.out '"ensemble":2'
contains ens-width ens-train.out '"type":"linear","width":32'
contains ens-members ens-train.out '"members":\[\{.*"seed":5.*"seed":6'
# The members' per-epoch figures decide nothing here (no reduce-on-plateau, no
# early stopping): each member is evaluated on the test set once, after its
# last epoch, not after every epoch; then the merged model once.
if json_last ens-train.out | grep -q '"eval":'; then
  fail ens-members-no-epoch-eval
else pass ens-members-no-epoch-eval; fi
[ "$(json_last ens-train.out | grep -o '"final":' | wc -l)" = 3 ] && pass ens-members-final \
  || fail ens-members-final
expect ens-m5 0 "$RUN" train "${ENS[@]}" --ensemble 1 --seed 5 --out m5.pooch "${T[@]}"
expect ens-m6 0 "$RUN" train "${ENS[@]}" --ensemble 1 --seed 6 --out m6.pooch "${T[@]}"
for m in ens m5 m6; do
  expect "ens-predict-$m" 0 "$RUN" predict --model "$m.pooch" --input data/test.txt --k "$NLAB" \
    --out "$m.pred" "${T[@]}"
done
# Each row: every label's ensemble score against the mean of the members' scores.
if paste -d'|' ens.pred m5.pred m6.pred | awk -F'|' '
    { n = split($1, e, " "); split($2, a, " "); split($3, b, " ")
      delete s; for (i in a) { split(a[i], p, ":"); s[p[1]] = p[2] }
      for (i in b) { split(b[i], p, ":"); s[p[1]] += p[2] }
      for (i = 1; i <= n; i++) { split(e[i], p, ":"); d = p[2] - s[p[1]] / 2
        if (d > 1e-3 || d < -1e-3) { print "row " NR " label " p[1] ": " p[2] " vs " s[p[1]] / 2; bad = 1; exit 1 } } }
    END { exit bad }'; then pass ens-mean-of-members; else fail ens-mean-of-members; fi
# With two threads the two members train at once, one thread each: the same
# bits as one after the other with one thread (ens.pooch above), their lines
# prefixed, their --log lines whole and tagged with the member.
expect ens-at-once 0 "$RUN" train "${ENS[@]}" --ensemble 2 --seed 5 --out ens2.pooch --log ens2.jsonl \
  --json --threads 2 --device cpu
contains ens-at-once-json ens-at-once.out '"members_at_once":2'
contains ens-one-at-a-time-json ens-train.out '"members_at_once":1'
cmp -s ens.pooch ens2.pooch && pass ens-at-once-same-model || fail "ens-at-once-same-model: ens2.pooch differs from ens.pooch"
contains ens-at-once-member1 ens-at-once.out '^member 1: epoch 2/2 '
contains ens-at-once-member2 ens-at-once.out '^member 2: trained [0-9]+ steps'
if [ "$(grep -c '"type":"epoch","member":1,' ens2.jsonl)" = 2 ] &&
  [ "$(grep -c '"type":"epoch","member":2,' ens2.jsonl)" = 2 ] &&
  python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' ens2.jsonl; then
  pass ens-at-once-log
else fail "ens-at-once-log: ens2.jsonl lacks either member's two epochs, or has a torn line"; fi
expect ens-bottleneck 1 "$RUN" train --data data --ensemble 2 --bottleneck 8 --out x.pooch "${T[@]}"
contains ens-bottleneck-message ens-bottleneck.err 'ensemble: members merge into one model only'
expect ens-resume 1 "$RUN" train --data data --ensemble 2 --resume ens.pooch --out x.pooch "${T[@]}"
contains ens-resume-message ens-resume.err 'resume with --ensemble 2'
# Left to auto, bag-of-words data with a dense output layer trains an
# ensemble of 2; a fixed fan-in model stays one model (with a checkpoint).
expect ens-default 0 "$RUN" train --data data --epochs 1 --hidden 8 --out ed.pooch --json "${T[@]}"
contains ens-default-json ens-default.out '"ensemble":2'
expect ens-default-ffi 0 "$RUN" train --data data --epochs 1 --hidden 8 --fan-in 4 --out ef.pooch \
  --json "${T[@]}"
if grep -q '"ensemble":' ens-default-ffi.out; then fail ens-default-ffi-one; else pass ens-default-ffi-one; fi
[ -s ef.pooch.ckpt ] && pass ens-default-ffi-checkpoint || fail ens-default-ffi-checkpoint
# The bag-of-words training defaults for a dense output layer: SGD from 0.15
# over 10 epochs, the cosine schedule down to 0; with Adam, 0.002 over 6; a
# fixed fan-in head trains with Adam.
expect bow-defaults 0 "$RUN" train --data data --ensemble 1 --hidden 8 --out bd.pooch --json "${T[@]}"
contains bow-defaults-sgd bow-defaults.out '"optimizer":{"kind":"sgd","lr":0.15,"epochs":10}'
contains bow-defaults-epochs bow-defaults.out '"epoch":10,[^}]*"lr":0(\.0)?[,}]'
if grep -q '"epoch":11,' bow-defaults.out; then fail bow-defaults-ten; else pass bow-defaults-ten; fi
expect bow-defaults-adam 0 "$RUN" train --data data --ensemble 1 --hidden 8 --optimizer adam \
  --out bda.pooch --json "${T[@]}"
contains bow-defaults-adam-six bow-defaults-adam.out '"optimizer":\{"kind":"adam","lr":0.002,"epochs":6,"eps":1e-08\}'
contains bow-defaults-ffi-adam ens-default-ffi.out '"kind":"adam"'
# A large label space (more input x label weights than a dense output layer
# gets, so the fixed fan-in head) trains Adam with epsilon 1e-4: with 1e-8
# every absent label's tiny, steady gradient took full-size steps and the
# logits slid down (the full-size Amazon-670K shape). --adam-eps sets it.
printf '4 10000 10000\n1 2:1\n9999 9999:1\n5,7 3:0.5 4:0.5\n0 1:1\n' > wide.txt
expect adam-eps-wide 0 "$RUN" train --train wide.txt --epochs 1 --hidden 8 --out aw.pooch --json "${T[@]}"
contains adam-eps-wide-auto adam-eps-wide.out '"optimizer":\{"kind":"adam","lr":0.002,"epochs":1,"eps":0.0001\}'
expect adam-eps-flag 0 "$RUN" train --train wide.txt --epochs 1 --hidden 8 --adam-eps 1e-6 \
  --out aw.pooch --json "${T[@]}"
contains adam-eps-flag-json adam-eps-flag.out '"optimizer":\{"kind":"adam","lr":0.002,"epochs":1,"eps":1e-06\}'
expect adam-eps-finetune 0 "$RUN" finetune --model aw.pooch --train wide.txt --epochs 1 \
  --out awf.pooch --json "${T[@]}"
contains adam-eps-finetune-auto adam-eps-finetune.out '"optimizer":\{"kind":"adam","lr":0.001,"epochs":1,"eps":0.0001\}'
expect range-adam-eps 2 "$RUN" train --train wide.txt --adam-eps 0 --out r.pooch "${T[@]}"
contains range-adam-eps-message range-adam-eps.err '^pooch-run: --adam-eps: 0 is out of range: use a number above 0 and at most 1'
# The cosine schedule ends the run at --lr-min-ratio x --lr.
expect cosine 0 "$RUN" train "${ENS[@]}" --ensemble 1 --lr 0.002 --lr-schedule cosine \
  --lr-min-ratio 0.25 --out cos.pooch --json "${T[@]}"
contains cosine-end cosine.out '"epoch":2,[^}]*"lr":0.0005[,}]'
# Reduce-on-plateau and early stopping decide on rows held out of the
# training set, never on the test set; the test set is evaluated once.
expect valid-split 0 "$RUN" train --data data --epochs 2 --hidden 16 --ensemble 1 \
  --plateau-patience 1 --valid-fraction 0.25 --out v.pooch --json "${T[@]}"
contains valid-split-said valid-split.out '^validation: [0-9]+ of [0-9]+ training rows held out'
contains valid-split-json valid-split.out '"valid":\{"rows":[0-9]+,"fraction":0.25\}'
contains valid-split-final valid-split.out '^test \(.*\), after the last epoch'
# finetune keeps reduce-on-plateau and early stopping on by default: they
# decide on held-out training rows too.
expect finetune-valid 0 "$RUN" finetune --model m.pooch --data data --epochs 1 --out fv.pooch \
  --json "${T[@]}"
contains finetune-valid-said finetune-valid.out '^validation: [0-9]+ of [0-9]+ training rows held out'
contains finetune-valid-final finetune-valid.out '^test \(.*\), after the last epoch'
expect no-valid-split 0 "$RUN" train --data data --epochs 1 --hidden 16 --ensemble 1 \
  --plateau-patience 0 --early-stop 0 --out nv.pooch --json "${T[@]}"
if grep -q '"valid":' no-valid-split.out; then fail no-valid-split-json; else pass no-valid-split-json; fi

echo
finish
