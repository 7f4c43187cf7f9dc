#!/usr/bin/env bash
# A small ResNet (resnet-18 with 32 base channels and the small stem) trained
# on scikit-learn's handwritten digits (tests/data/make_digits.py: 1437
# training and 360 test images of 8x8) through pooch-run train, eval and
# predict: at least 97% top-1 accuracy on the test images, which training
# never sees (the issue's figure). The figure moves with the CPU: oneDNN
# picks its convolution kernels by the vector ISA, their sums round
# differently, and SGD carries that into other weights. The recipe was
# chosen on five validation folds of the training images under four ISAs
# (docs/BENCHMARKS.md, "The digits recipe again"): fold means 98.3-98.7%,
# where the earlier one (16 channels, 20 epochs at a constant 0.01, which
# this test asked 96% of) gave 96.2-98.0%; on the test images 98.3-98.9%
# under AVX-512, AVX2, AVX and SSE4.1 on a Xeon (97% is 350 of 360).
# Also: image sets' errors and the normalisation recorded in the model.
# Usage: test_cnn_digits.sh PATH/TO/pooch-run PATH/TO/tests/data
set -uo pipefail

RUN=${1:?usage: test_cnn_digits.sh PATH/TO/pooch-run DATA_DIR}
DATA=${2:?usage: test_cnn_digits.sh PATH/TO/pooch-run DATA_DIR}
RUN=$(cd "$(dirname "$RUN")" && pwd)/$(basename "$RUN")
DATA=$(cd "$DATA" && pwd)
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cli_scratch cnn
# The number after "key": in the last line of FILE.
json_num() { tail -n 1 "$2" | grep -Eo "\"$1\": ?[-0-9.e]+" | tail -n 1 | sed -E 's/.*: ?//'; }

T=(--threads 2 --device cpu)
TRAIN=(--data "$DATA/digits_train_x.npy" --targets "$DATA/digits_train_y.npy")
TEST=(--data "$DATA/digits_test_x.npy" --targets "$DATA/digits_test_y.npy")

start=$(date +%s.%N)
# SGD with weight decay and 1-pixel crops (unregularised runs reach 100% on
# the training images and wander by a few points from epoch to epoch), the
# rate down a cosine from 0.02 over 30 epochs.
expect train 0 "$RUN" train "${TRAIN[@]}" --spec "$DATA/resnet_digits.json" --epochs 30 \
  --batch 32 --optimizer sgd --lr 0.02 --lr-schedule cosine --weight-decay 5e-4 --crop-pad 1 \
  --early-stop 0 --seed 3 --valid-fraction 0.1 --out digits.pooch "${T[@]}" --json
end=$(date +%s.%N)
echo "     training took $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s"
contains "train: the spec records the input and normalisation" train.out \
  '"normalize": ?\{"mean"'

expect eval 0 "$RUN" eval --model digits.pooch "${TEST[@]}" "${T[@]}" --json
acc=$(json_num accuracy eval.out)
top5=$(json_num top5 eval.out)
echo "     test accuracy $acc, top-5 $top5"
if [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a >= 0.97) }'; then
  pass "test accuracy $acc >= 0.97"
else
  fail "test accuracy '$acc' < 0.97"
  tail -3 eval.out | sed 's/^/    | /'
fi
if [ -n "$top5" ] && awk -v a="$top5" -v b="$acc" 'BEGIN { exit !(a >= b && a <= 1) }'; then
  pass "top-5 $top5 is at least top-1"
else
  fail "top-5 '$top5' below top-1 '$acc'"
fi

expect predict 0 "$RUN" predict --model digits.pooch --data "$DATA/digits_test_x.npy" \
  --out pred.npy "${T[@]}"
if [ -s pred.npy ]; then pass "predict wrote pred.npy"; else fail "predict wrote no pred.npy"; fi

# Augmented training runs and is repeatable for one seed.
for k in 1 2; do
  expect "augment$k" 0 "$RUN" train "${TRAIN[@]}" --spec "$DATA/resnet_digits.json" \
    --epochs 1 --max-steps 5 --batch 16 --seed 5 --crop-pad 1 --flip --out aug$k.pooch "${T[@]}"
done
if cmp -s aug1.pooch aug2.pooch; then pass "augmented runs with one seed are identical"; else
  fail "augmented runs with one seed differ"; fi
# The next batch is augmented on a thread during the step: the same bits as
# preparing each batch in place (--no-prefetch).
expect augment_inline 0 "$RUN" train "${TRAIN[@]}" --spec "$DATA/resnet_digits.json" \
  --epochs 1 --max-steps 5 --batch 16 --seed 5 --crop-pad 1 --flip --no-prefetch \
  --out aug3.pooch "${T[@]}" --json
if cmp -s aug1.pooch aug3.pooch; then pass "prefetched and in-place augmentation are identical"
else fail "prefetched and in-place augmentation differ"; fi
contains "--no-prefetch reported" augment_inline.out '"prefetch": ?false'

# Finetuning with a new head: the trained network's body under a fresh
# output layer over 12 classes (shapes unlike the file's 10), trained for
# one epoch, against one epoch from scratch: the kept body
# must carry the accuracy (it would be the scratch run's if the weights
# were not kept).
FT=(--epochs 1 --batch 32 --optimizer sgd --lr 0.01 --weight-decay 5e-4 --early-stop 0
  --seed 4 --valid-fraction 0 "${T[@]}")
expect finetune 0 "$RUN" finetune --model digits.pooch "${TRAIN[@]}" --new-head 12 "${FT[@]}" \
  --out ft.pooch --json
contains "finetune: a new head of 12 classes" finetune.out '"new_head": ?12'
expect ft_eval 0 "$RUN" eval --model ft.pooch "${TEST[@]}" "${T[@]}" --json
ft_acc=$(json_num accuracy ft_eval.out)
ft_top5=$(json_num top5 ft_eval.out)
expect scratch 0 "$RUN" train "${TRAIN[@]}" --spec "$DATA/resnet_digits.json" "${FT[@]}" \
  --out scratch.pooch
expect scratch_eval 0 "$RUN" eval --model scratch.pooch "${TEST[@]}" "${T[@]}" --json
scratch_acc=$(json_num accuracy scratch_eval.out)
echo "     finetuned: accuracy $ft_acc, top-5 $ft_top5; from scratch: $scratch_acc"
if [ -n "$ft_acc" ] && awk -v a="$ft_acc" 'BEGIN { exit !(a >= 0.95) }'; then
  pass "finetuned accuracy $ft_acc >= 0.95"
else
  fail "finetuned accuracy '$ft_acc' < 0.95"
fi
if [ -n "$scratch_acc" ] && awk -v a="$ft_acc" -v b="$scratch_acc" \
  'BEGIN { exit !(a >= b + 0.05) }'; then
  pass "the kept body: finetuned $ft_acc >= scratch $scratch_acc + 0.05"
else
  fail "finetuned '$ft_acc' not 0.05 above scratch '$scratch_acc'"
fi
expect ft_fewer 2 "$RUN" finetune --model digits.pooch "${TRAIN[@]}" --new-head 5 "${FT[@]}" \
  --out x.pooch
contains "--new-head below the data's classes: refused" ft_fewer.err 'fewer classes'

# --ensemble trains bag-of-words models only: refused for images, not ignored.
expect ensemble_refused 1 "$RUN" train "${TRAIN[@]}" --spec "$DATA/resnet_digits.json" \
  --ensemble 2 --epochs 1 --out x.pooch "${T[@]}"
contains "--ensemble refused for images" ensemble_refused.err 'bag-of-words models only'

# A convolutional spec refuses 2-D rows, naming what it needs.
expect synth 0 "$RUN" synth --kind classification --rows 20 --features 6 --out rows
expect rows_refused 2 "$RUN" train --data rows/X.npy --targets rows/Y.npy \
  --spec "$DATA/resnet_digits.json" --epochs 1 --out x.pooch "${T[@]}"
contains "rows refused: names the data" rows_refused.err 'must be images'

# Image arrays that hold no image are refused, naming the file and shape
# (fuzz_image_npy found images_from_npy taking a zero height and overflowing
# on (0, 4, 2^63-1, 8); pooch-run refuses such arrays before that).
npy_u8() {  # FILE SHAPE: a uint8 .npy header with no data after it
  local h="{'descr': '|u1', 'fortran_order': False, 'shape': $2, }"
  printf '\x93NUMPY\x01\x00' > "$1"
  printf "\\x$(printf %02x $((${#h} % 256)))\\x$(printf %02x $((${#h} / 256)))" >> "$1"
  printf '%s' "$h" >> "$1"
}
npy_u8 zero_height.npy '(4, 0, 4, 3)'
npy_u8 huge_width.npy '(0, 4, 9223372036854775807, 8)'
npy_u8 no_images.npy '(0, 8, 8, 1)'
for bad in zero_height huge_width no_images; do
  expect "$bad" 2 "$RUN" train --data "$bad.npy" --targets "$DATA/digits_train_y.npy" \
    --spec "$DATA/resnet_digits.json" --epochs 1 --out x.pooch "${T[@]}"
done
contains "zero height refused" zero_height.err 'zero_height.npy: the array \(4, 0, 4, 3\) is empty'
contains "huge image refused" huge_width.err 'huge_width.npy: the array \(0, 4, 9223372036854775807, 8\) is empty'
contains "no images refused" no_images.err 'no_images.npy: the array \(0, 8, 8, 1\) is empty'

# --threads 1 keeps to one core. oneDNN's primitives take their thread count
# when they are made (at plan time), so one made with OpenMP's default ran
# a 1-thread session's convolutions on every core. 64 random 64x64 images
# (convolutions large enough for oneDNN to split): the CPU time (user +
# system) may not pass the wall time by more than the input thread's share.
npy_header() {  # FILE DESCR SHAPE: a .npy header padded to 64 bytes
  local h="{'descr': '$2', 'fortran_order': False, 'shape': $3, }"
  while [ $(((10 + ${#h} + 1) % 64)) != 0 ]; do h="$h "; done
  h="$h"$'\n'
  printf '\x93NUMPY\x01\x00' > "$1"
  printf "\\x$(printf %02x $((${#h} % 256)))\\x$(printf %02x $((${#h} / 256)))" >> "$1"
  printf '%s' "$h" >> "$1"
}
npy_header big_x.npy '|u1' '(64, 64, 64, 3)'
head -c $((64 * 64 * 64 * 3)) /dev/urandom >> big_x.npy
npy_header big_y.npy '<i4' '(64,)'
head -c 256 /dev/zero >> big_y.npy
echo '{"family": "resnet", "depth": 18}' > resnet18.json
TIMEFORMAT='%R %U %S'
{ time "$RUN" train --data big_x.npy --targets big_y.npy --spec resnet18.json --epochs 1 \
  --batch 8 --valid-fraction 0 --optimizer sgd --out big.pooch --threads 1 --device cpu \
  > one_thread.out 2> one_thread.err; } 2> one_thread.time
read -r wall user sys < <(tail -n 1 one_thread.time)
echo "     --threads 1: ${wall} s wall, ${user} s user, ${sys} s system"
if awk -v w="$wall" -v u="$user" -v s="$sys" 'BEGIN { exit !(u + s <= 1.1 * w + 0.1) }'; then
  pass "--threads 1 uses one core"
else
  fail "--threads 1 used ${user} + ${sys} s of CPU in ${wall} s"
  tail -n 3 one_thread.err | sed 's/^/    | /'
fi

finish
