#!/usr/bin/env bash
# pooch-run import and export of torchvision state dicts (resnet, vgg): the
# golden files of tests/golden/make_cnn_import_golden.py imported with
# nothing but the file, exported and imported again (the same model file),
# and the refusals: a depth the names do not fit, a file of another kind,
# flags that only apply to state dicts (exit codes per docs/CLI.md).
# tests/golden/test_cnn_import.cpp checks the logits against PyTorch.
# Usage: test_cnn_import.sh PATH/TO/pooch-run PATH/TO/tests/golden
set -uo pipefail

RUN=${1:?usage: test_cnn_import.sh PATH/TO/pooch-run GOLDEN_DIR}
GOLD=${2:?usage: test_cnn_import.sh PATH/TO/pooch-run GOLDEN_DIR}
RUN=$(cd "$(dirname "$RUN")" && pwd)/$(basename "$RUN")
GOLD=$(cd "$GOLD" && pwd)
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cli_scratch cnnio

for m in resnet18_tiny resnet50_tiny vgg11bn_tiny; do
  expect "import_$m" 0 "$RUN" import --from "$GOLD/$m.safetensors" --out "$m.pooch" --json
  expect "export_$m" 0 "$RUN" export --model "$m.pooch" --to "$m.back.safetensors"
  expect "reimport_$m" 0 "$RUN" import --from "$m.back.safetensors" --out "$m.again.pooch"
  if cmp -s "$m.pooch" "$m.again.pooch"; then pass "$m: export then import gives the same model file"
  else fail "$m: export then import gives another model file"; fi
done
contains "resnet-50 told from the names" import_resnet50_tiny.out '"depth": ?50'
contains "vgg's image size from its classifier" import_vgg11bn_tiny.out '"height": ?32'
contains "vgg's batch normalisation from the names" import_vgg11bn_tiny.out '"batchnorm": ?true'

expect info 0 "$RUN" info resnet18_tiny.pooch
contains "info: a resnet" info.out 'resnet'
contains "info: the images" info.out 'input +3x224x224 images'
contains "info: the depth" info.out 'depth +18'

expect normalize 0 "$RUN" import --from "$GOLD/resnet18_tiny.safetensors" --normalize imagenet \
  --image-size 64 --batch 4 --out n.pooch --json
contains "--normalize imagenet recorded" normalize.out '"mean": ?\[0.485'
contains "--image-size 64" normalize.out '"height": ?64'

expect depth34 2 "$RUN" import --from "$GOLD/resnet18_tiny.safetensors" --depth 34 --out x.pooch
contains "a depth the names do not fit: names the tensor" depth34.err "layer1.2.conv1.weight"
expect gpt_file 2 "$RUN" import --from "$GOLD/gpt_tiny.safetensors" --out x.pooch
contains "a file of another kind" gpt_file.err "not a torchvision"
expect bad_size 1 "$RUN" import --from "$GOLD/resnet18_tiny.safetensors" --image-size 0x3 \
  --out x.pooch
expect bad_normalize 1 "$RUN" import --from "$GOLD/resnet18_tiny.safetensors" \
  --normalize cifar --out x.pooch
expect gpt_with_depth 1 "$RUN" import --from "$GOLD/lm" --depth 18 --out x.pooch
if [ -e x.pooch ]; then fail "a refused import wrote x.pooch"; else pass "refused imports wrote nothing"; fi

finish
