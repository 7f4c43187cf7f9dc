#!/usr/bin/env bash
# tests/device/run.sh — the one-call check of the CUDA backend on a lent GPU
# machine (read /work/.library/device/README.md). It runs binaries built on
# the build machine by tests/device/build.sh and carried as build-device/dist
# (the archive pooch-device.tar.xz, unpacked here into a temporary folder; an
# unpacked dist with bin/ and lib/ works too): nothing is built or installed.
#
#   1. the machine: GPU, driver, OS                     (env.txt)
#   2. finds the CUDA 13 libraries (cuBLAS, cuSPARSE and what they need; cuDNN
#      too, for later convolution kernels) and puts their folders on
#      LD_LIBRARY_PATH: the binaries link the CUDA runtime statically and open
#      cuBLAS and cuSPARSE with dlopen when the CUDA backend starts, so ldd
#      does not show them. Says within seconds if the binaries cannot start
#      or those libraries are missing: ldd, then
#      `pooch-opcheck --list` under a 10 s timeout    (env.txt)
#      Then starts, in the background, the synthetic data of step 8.
#   3. test_cuda_backend: arena, streams, events, copies, budget, errors
#   4. pooch-opcheck --backend cuda: every CUDA kernel against kernels/ref
#   5. pooch-bench-cuda: the fused head (ffi_loss, ffi_loss_grad, ffi_topk) and
#      the fixed fan-in layer at 670091 labels, fan-in 32, and
#      the rest of the XMC head: time, bytes moved against the measured copy
#      bandwidth, spot checks                           (bench_log.txt)
#   6. out of core on the GPU: GPT-2 124M- and ResNet-50-shaped models train
#      a few steps (and an XMC model an epoch of a small synthetic set, whose
#      smaller arenas run its updates and input layer on the host) in core,
#      then with the arena at 1/3 and 1/5 of that
#      (ooc.sh): the step time of each against in core, and whether the
#      weights are byte for byte the in-core ones, and for GPT and ResNet what
#      machines/h100.json or h200.json (by nvidia-smi's name) predicts for
#      each run (pooch-run plan --machine, on the CPU); after step 8, bench/ooc's
#      tables (pooch-bench-ooc --device cuda), time permitting   (ooc.txt)
#   7. GPT-2 124M beside PyTorch on the same card: pooch-bench-lm --device
#      cuda (with its time per op kind) and bench/peers/lm_torch.py --device
#      cuda (transformers' GPT2LMHeadModel, f32, TF32 off), the same shapes:
#      training tokens per second, device memory, generation (lm.txt)
#   8. one XMC training epoch through pooch-run on CUDA, the arena capped at
#      4 GB, on Amazon-670K-shaped synthetic data, after the step's per-op
#      profile                                          (xmc.txt)
#      POOCH_XMC_SCALE (default 0.25; 1 is the real set: 670091 labels, 490449
#      rows), POOCH_XMC_HIDDEN (512), POOCH_XMC_BATCH (the CLI's default)
#   9. compute-sanitizer memcheck on the benchmark's small shapes, if there is
#      time and the tool works on this machine   (appended to opcheck_cuda.txt)
#  10. only when asked (POOCH_DEVICE_STEPS="10"): the language-model issue's
#      card runs, full finetuning of GPT-2 774M and LoRA on 1.5B, in core and
#      with --device-memory 4G and 8G (ooc.sh gpt-large, gpt-xl-lora; about
#      four minutes on an H200, planned, not measured)   (appended to ooc.txt)
# A report goes to "$OUT" (summary.txt and one log per step: at most 8 files,
# as the device tool returns no more), and a short table is printed last.
# Under 9 minutes in all (each step has a timeout). POOCH_DEVICE_STEPS (e.g.
# "4 6") runs only the steps named (1 to 3 always run), to check a fix again
# in less device time. A binary that crashes is run again under cuda-gdb for
# a backtrace, appended to its log.
#
# usage (device tool): carry ["build-device/dist"], command
#   bash tests/device/run.sh
# Exit status: 0 all passed, 1 a check failed, 2 the binaries are missing,
# 3 the binaries cannot start here.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
DIST=${POOCH_DIST:-build-device/dist}
T0=$(date +%s)
BUDGET=${POOCH_DEVICE_BUDGET:-500}  # seconds for the whole script, leaving room under 9 minutes
STATUS=0
ROWS=()
# Scratch outside $OUT (only 8 files come back from there): the unpacked
# binaries, the synthetic data, logs that are folded into others.
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/pooch-device.XXXXXX") || exit 2
SYNTH_PID=""

elapsed() { echo $(($(date +%s) - T0)); }
STEPS=" ${POOCH_DEVICE_STEPS:-4 5 6 7 8 9} "
wanted() { [[ "$STEPS" == *" $1 "* ]]; }
# backtrace LOG BINARY ARGS...: after a crash (exit 128 + signal), the same
# run under cuda-gdb, its backtrace appended to LOG.
backtrace() {
  local log=$1
  shift
  local gdb
  gdb=$(command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null | head -n 1)
  [ -n "$gdb" ] || { echo "== no cuda-gdb for a backtrace" >> "$log"; return; }
  echo "== backtrace (cuda-gdb)" >> "$log"
  timeout 90 "$gdb" -q -batch -ex 'set pagination off' -ex run -ex bt -ex 'info registers rip' \
    --args "$@" 2>&1 | grep -vE '^\[(New|Thread|Detaching)' | tail -n 60 >> "$log"
}
left() { echo $((BUDGET - $(elapsed))); }
# Whether step STEP runs now: asked for, its binary there, and at least MIN
# of the T seconds it may take left; otherwise a SKIP row says why.
#   may_run STEP ROW_NAME BINARY MIN T
may_run() {
  wanted "$1" || return 1
  if [ ! -x "$BIN/$3" ]; then
    row "$2" "SKIP" "no $3 in the binaries (rebuild with tests/device/build.sh)"
    return 1
  fi
  if [ "$5" -lt "$4" ]; then
    row "$2" "SKIP" "no time left"
    return 1
  fi
}
row() { ROWS+=("$(printf '%-20s %-9s %s' "$1" "$2" "$3")"); }
say() { echo "run.sh [$(elapsed)s] $*"; }

finish() {
  if [ -n "$SYNTH_PID" ]; then kill "$SYNTH_PID" 2>/dev/null; wait "$SYNTH_PID" 2>/dev/null; fi
  {
    echo "pooch device check, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(elapsed) s"
    [ -f "$DIST/BUILD.txt" ] && head -n 1 "$DIST/BUILD.txt"
    head -n 1 "$OUT/env.txt" 2>/dev/null
    echo
    for r in "${ROWS[@]}"; do echo "$r"; done
  } > "$OUT/summary.txt"
  echo
  if [ -f "$OUT/bench_log.txt" ]; then
    sed -n '/^kernel /,/^bench:/p' "$OUT/bench_log.txt"
    echo
  fi
  cat "$OUT/summary.txt"
  rm -rf "$TMPD"
  exit "${1:-$STATUS}"
}

# The binaries: build.sh's archive, unpacked here, or an unpacked dist.
# Python's lzma unpacks it where the xz program is missing.
ARCHIVE=$DIST/pooch-device.tar.xz
if [ -f "$ARCHIVE" ]; then
  if ! tar -C "$TMPD" -xJf "$ARCHIVE" 2>/dev/null &&
     ! python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
       "$ARCHIVE" "$TMPD"; then
    say "could not unpack $ARCHIVE"
    row "binaries" "MISSING" "$ARCHIVE does not unpack"
    finish 2
  fi
  DIST=$TMPD
fi
BIN=$DIST/bin
if [ ! -x "$BIN/pooch-opcheck" ]; then
  say "no binaries in $BIN: run tests/device/build.sh on the build machine and carry build-device/dist"
  row "binaries" "MISSING" "$BIN/pooch-opcheck"
  finish 2
fi

# ---- 1. the machine ------------------------------------------------------------
{
  timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem \
    --format=csv,noheader 2>&1 || echo "nvidia-smi failed"
  timeout 10 nvidia-smi 2>&1 | head -n 20
  uname -srm
  grep -E '^(PRETTY_NAME)=' /etc/os-release 2>/dev/null
  ldd --version 2>&1 | head -n 1
} > "$OUT/env.txt" 2>&1
say "GPU: $(head -n 1 "$OUT/env.txt")"
# The card's description in machines/, where there is one: ooc.sh prints
# what it predicts beside what the card ran (step 6).
# The names of the cards described, not their kin: an H100 PCIe or NVL and
# a GH200 (NVLink-C2C to the host) differ in rates or link.
case $(head -n 1 "$OUT/env.txt") in
  *GH200* | *"H200 NVL"*) ;;
  *"NVIDIA H200"*) export POOCH_OOC_MACHINE=$PWD/machines/h200.json ;;
  *"H100 80GB HBM3"*) export POOCH_OOC_MACHINE=$PWD/machines/h100.json ;;
esac

# ---- 2. libraries, and whether the binaries start ----------------------------------
# The loader finds what ldconfig knows; otherwise the toolkit's folders, then
# the Python packages' (nvidia-cublas etc. beside PyTorch).
# (CUDA 13's installer puts them in lib/ beside lib64/, as on the build machine.)
SEARCH=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib
        /usr/local/cuda-13*/lib64 /usr/local/cuda-13*/lib /usr/local/cuda-13*/targets/x86_64-linux/lib
        /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/local/lib)
SITE=$(timeout 10 python3 -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null)
LIBDIRS=()
# What the CUDA backend dlopens (libcublas, libcusparse) and what they need; the
# rest is listed for the record.
REQUIRED=" libcublas.so.13 libcublasLt.so.13 libcusparse.so.12 libnvJitLink.so.13 "
LIBS_MISSING=$TMPD/libs_missing.txt
: > "$LIBS_MISSING"
{
  echo "== libraries"
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcusparse.so.12 libnvJitLink.so.13 \
             libcudnn.so.9; do
    # ldconfig -p lines start with a tab: "\tlibcudart.so.13 (libc6,x86-64) => /path".
    known=$(ldconfig -p 2>/dev/null | awk -v n="$lib" '$1 == n { print $NF; exit }')
    if [ -n "$known" ]; then
      echo "$lib: $known (ldconfig)"
      continue
    fi
    found=""
    for d in "${SEARCH[@]}"; do
      if [ -e "$d/$lib" ]; then found=$d; break; fi
    done
    if [ -z "$found" ]; then
      while read -r s; do
        [ -d "$s/nvidia" ] || continue
        p=$(find "$s/nvidia" -name "$lib" -print -quit 2>/dev/null)
        if [ -n "$p" ]; then found=$(dirname "$p"); break; fi
      done <<< "$SITE"
    fi
    echo "$lib: ${found:-NOT FOUND}"
    [ -n "$found" ] && LIBDIRS+=("$found")
    if [ -z "$found" ] && [[ "$REQUIRED" == *" $lib "* ]]; then echo "$lib" >> "$LIBS_MISSING"; fi
  done
} >> "$OUT/env.txt"
LD=$(realpath "$DIST/lib")
for d in "${LIBDIRS[@]}"; do
  case ":$LD:" in *":$d:"*) ;; *) LD=$LD:$d ;; esac
done
# PyTorch (step 7) runs with the path the machine gave, not this one: the
# build machine's libgomp and others here would be found before its own.
ORIG_LD=${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH=$LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> "$OUT/env.txt"

missing=""
if [ -s "$LIBS_MISSING" ]; then
  missing=" the CUDA backend needs: $(tr '\n' ' ' < "$LIBS_MISSING")"
fi
for b in "$BIN"/*; do
  echo "== ldd $(basename "$b")" >> "$OUT/env.txt"
  ldd "$b" >> "$OUT/env.txt" 2>&1
  m=$(ldd "$b" 2>&1 | grep 'not found' | awk '{print $1}' | sort -u | tr '\n' ' ')
  [ -n "$m" ] && missing="$missing $(basename "$b"): $m"
done
if [ -n "$missing" ]; then
  say "libraries not found:$missing"
  row "start" "FAIL" "libraries not found:$missing"
  finish 3
fi
LIST=$TMPD/opcheck_list.txt
timeout 10 "$BIN/pooch-opcheck" --list > "$LIST" 2>&1
rc=$?
# A C++ runtime older than the build machine's: use the one build.sh carried.
if [ $rc -ne 0 ] && grep -qE 'GLIBCXX_|CXXABI_|GCC_[0-9]' "$LIST" &&
   [ -d "$DIST/lib-fallback" ]; then
  say "this machine's libstdc++ is older than the build's; using the carried one"
  LD_LIBRARY_PATH=$(realpath "$DIST/lib-fallback"):$LD_LIBRARY_PATH
  export LD_LIBRARY_PATH
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH (with the carried libstdc++)" >> "$OUT/env.txt"
  timeout 10 "$BIN/pooch-opcheck" --list > "$LIST" 2>&1
  rc=$?
fi
{ echo "== pooch-opcheck --list (exit $rc)"; cat "$LIST"; } >> "$OUT/env.txt"
if [ $rc -ne 0 ]; then
  say "pooch-opcheck --list failed (exit $rc): the binaries do not start here"
  tail -n 5 "$LIST"
  row "start" "FAIL" "pooch-opcheck --list exit $rc (see env.txt)"
  finish 3
fi
cuda_listed=$(grep -c '^  cuda: ' "$LIST")
row "start" "ok" "binaries start; opcheck lists $cuda_listed ops with a cuda line"
say "binaries start"

# The synthetic data of step 8, written by the CPU while the GPU checks run.
XMC_SCALE=${POOCH_XMC_SCALE:-0.25}
XMC_HIDDEN=${POOCH_XMC_HIDDEN:-512}
XMC_DATA=$TMPD/xmc-data
XMC_LOG=$TMPD/xmc_synth.txt
if [ -x "$BIN/pooch-run" ] && wanted 8; then
  timeout 240 "$BIN/pooch-run" synth --preset Amazon-670K --scale "$XMC_SCALE" \
    --out "$XMC_DATA" > "$XMC_LOG" 2>&1 &
  SYNTH_PID=$!
fi

# ---- 3. backend unit tests ------------------------------------------------------
timeout 60 "$BIN/test_cuda_backend" > "$OUT/test_cuda_backend.txt" 2>&1
rc=$?
passed=$(grep -oE '\[  PASSED  \] [0-9]+' "$OUT/test_cuda_backend.txt" | grep -oE '[0-9]+$')
skipped=$(grep -oE '\[  SKIPPED \] [0-9]+ test' "$OUT/test_cuda_backend.txt" | grep -oE '[0-9]+')
failed=$(grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/test_cuda_backend.txt" | sed 's/\[  FAILED  \] //' | tr '\n' ' ')
if [ $rc -eq 0 ]; then
  row "test_cuda_backend" "ok" "${passed:-0} passed, ${skipped:-0} skipped"
else
  STATUS=1
  row "test_cuda_backend" "FAIL" "exit $rc; failed: ${failed:-?}"
fi
say "test_cuda_backend exit $rc"

# ---- 4. the kernel checker on CUDA ---------------------------------------------------
t=$(( $(left) - 230 ))
[ $t -gt 200 ] && t=200
if ! wanted 4; then
  :
elif [ $t -lt 30 ]; then
  row "opcheck cuda" "SKIP" "no time left"
else
  timeout $t "$BIN/pooch-opcheck" --backend cuda > "$OUT/opcheck_cuda.txt" 2>&1
  rc=$?
  totals=$(grep -E '^opcheck: ' "$OUT/opcheck_cuda.txt" | tail -n 1)
  case $rc in
    0) row "opcheck cuda" "ok" "${totals#opcheck: }" ;;
    77) row "opcheck cuda" "SKIP" "$(grep -m1 skipped "$OUT/opcheck_cuda.txt")" ;;
    124) STATUS=1; row "opcheck cuda" "TIMEOUT" "after ${t}s; $(grep -c '^PASS' "$OUT/opcheck_cuda.txt") passed so far" ;;
    *) STATUS=1; row "opcheck cuda" "FAIL" "exit $rc; ${totals#opcheck: }" ;;
  esac
  # The first failing checks, a row each (process substitution keeps row()
  # in this shell).
  if [ $rc -ne 0 ] && [ $rc -ne 77 ] && [ $rc -ne 124 ]; then
    while read -r l; do row "" "" "$l"; done < <(grep -E '^FAIL|crashed' "$OUT/opcheck_cuda.txt" | head -n 12 | cut -c1-160)
  fi
  say "opcheck exit $rc"
fi

# ---- 5. benchmarks ------------------------------------------------------------------
t=$(( $(left) - 150 ))
[ $t -gt 150 ] && t=150
if ! wanted 5; then
  :
elif [ $t -lt 30 ]; then
  row "bench" "SKIP" "no time left"
else
  timeout $t "$BIN/pooch-bench-cuda" > "$OUT/bench_log.txt" 2>&1
  rc=$?
  if [ $rc -gt 128 ] && [ $rc -ne 137 ]; then
    backtrace "$OUT/bench_log.txt" "$BIN/pooch-bench-cuda" --quick
  fi
  case $rc in
    0) row "bench" "ok" "$(grep -m1 '^copy:' "$OUT/bench_log.txt")" ;;
    77) STATUS=1; row "bench" "NO GPU" "$(grep -m1 skipped "$OUT/bench_log.txt")" ;;
    124) STATUS=1; row "bench" "TIMEOUT" "after ${t}s (bench_log.txt has what ran)" ;;
    *) STATUS=1; row "bench" "FAIL" "exit $rc; $(grep -m1 -E 'FAIL|bench:' "$OUT/bench_log.txt" | cut -c1-140)" ;;
  esac
  say "bench exit $rc"
fi

# ---- 6. out of core on the GPU: GPT-2 124M, ResNet-50 and XMC at 1/3 and 1/5 of their arenas --
# ooc.sh: in core, then the arena capped; step times against in core and
# whether the weights are the in-core ones byte for byte. All in ooc.txt.
# (XMC last: small and fast, it is there for the host launches, which no
# other step runs on the card.)
: > "$OUT/ooc.txt"
# ooc_row STEP MODEL ROW_NAME STEPS RESERVE MAX MIN: one ooc.sh run, given
# what is left less RESERVE seconds (at most MAX; skipped under MIN), into
# ooc.txt and a row.
ooc_row() {
  local step=$1 model=$2 name=$3 steps=$4 t=$(( $(left) - $5 ))
  [ $t -gt "$6" ] && t=$6
  wanted "$step" || return 0
  if [ $t -lt "$7" ]; then
    row "$name" "SKIP" "no time left"
    return 0
  fi
  echo "== ooc.sh $model" >> "$OUT/ooc.txt"
  timeout $t bash tests/device/ooc.sh "$model" "$BIN" "$TMPD/ooc-$model" "$steps" > "$TMPD/ooc.txt" 2>&1
  local rc=$?
  cat "$TMPD/ooc.txt" >> "$OUT/ooc.txt"
  if [ $rc -eq 124 ]; then  # cut off: the end of the run it was in
    local last
    last=$(ls -t "$TMPD/ooc-$model"/*.txt 2>/dev/null | head -n 1)
    [ -n "$last" ] && { echo "== cut off in $(basename "$last"):"; tail -n 12 "$last"; } >> "$OUT/ooc.txt"
  fi
  rm -rf "$TMPD/ooc-$model"
  local brief
  brief=$(grep -m1 '^summary: ' "$TMPD/ooc.txt" | sed 's/^summary: //')
  case $rc in
    0) row "$name" "ok" "same bits as in core; $(echo "$brief" | cut -c1-130)" ;;
    124) STATUS=1; row "$name" "TIMEOUT" "after ${t}s (ooc.txt has what ran)" ;;
    *) STATUS=1; row "$name" "FAIL" "exit $rc; $(grep -m1 -E 'rc=[1-9]|DIFFERS|ooc.sh:' "$TMPD/ooc.txt" | cut -c1-120)" ;;
  esac
  say "$name exit $rc"
}
for model in gpt resnet50 xmc; do
  ooc_row 6 $model "$model out of core" 12 110 120 40
done
# ---- 7. GPT-2 124M beside PyTorch on the same card --------------------------------------
# Context 1024, batch 8, GPT-2's vocabulary, random weights, 5 steps (the
# median after the first), then 32 greedy tokens with the KV cache. pooch's
# per-op-kind times (--profile 1) go to the same file.
LM=$OUT/lm.txt
LM_SHAPE=(--layers 12 --heads 12 --width 768 --vocab 50257 --ctx 1024 --batch 8 --steps 5
          --threads 16 --gen-tokens 32 --device cuda)
t=$(( $(left) - 150 ))
[ $t -gt 120 ] && t=120
if may_run 7 "gpt vs torch" pooch-bench-lm 40 $t; then
  echo "== pooch-bench-lm ${LM_SHAPE[*]} --profile 1" > "$LM"
  timeout $((t / 2)) "$BIN/pooch-bench-lm" "${LM_SHAPE[@]}" --profile 1 >> "$LM" 2>&1
  prc=$?
  echo "== exit $prc" >> "$LM"
  echo "== python3 bench/peers/lm_torch.py ${LM_SHAPE[*]}" >> "$LM"
  env LD_LIBRARY_PATH="$ORIG_LD" timeout $((t / 2)) python3 bench/peers/lm_torch.py "${LM_SHAPE[@]}" >> "$LM" 2>&1
  trc=$?
  echo "== exit $trc" >> "$LM"
  # Each side's JSON is the line after its command that starts with "{".
  brief=$(timeout 10 python3 - "$LM" <<'EOF' 2>/dev/null
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
if len(runs) == 2:
    p, t = runs
    print("train tokens/s %.0f vs %.0f (%.2fx); generate %.0f vs %.0f tokens/s; device MiB %.0f vs %.0f"
          % (p["train_tokens_s"], t["train_tokens_s"], p["train_tokens_s"] / t["train_tokens_s"],
             p["gen_tokens_s"], t["gen_tokens_s"], p["arena_mib"] or 0, t["peak_device_mib"] or 0))
EOF
)
  if [ $prc -eq 0 ] && [ $trc -eq 0 ] && [ -n "$brief" ]; then
    row "gpt vs torch" "ok" "$(echo "$brief" | cut -c1-140)"
  else
    STATUS=1
    row "gpt vs torch" "FAIL" "pooch exit $prc, torch exit $trc (lm.txt)"
  fi
  say "gpt vs torch done"
fi

# ---- 8. one XMC training epoch through the CLI --------------------------------------
# Amazon-670K's shape (at POOCH_XMC_SCALE), a sparse input layer, the fixed
# fan-in head (32), the arena capped at 4 GB; the CLI's --json line reports.
XMC=$OUT/xmc.txt
if ! wanted 8; then
  :
elif [ -z "$SYNTH_PID" ]; then
  row "xmc epoch" "SKIP" "no pooch-run in the binaries (rebuild with tests/device/build.sh)"
else
  wait "$SYNTH_PID"
  rc=$?
  SYNTH_PID=""
  { echo "== pooch-run synth --preset Amazon-670K --scale $XMC_SCALE (exit $rc)"; cat "$XMC_LOG"; } > "$XMC"
  t=$(( $(left) - 40 ))
  [ $t -gt 150 ] && t=150
  if [ $rc -ne 0 ]; then
    STATUS=1
    row "xmc epoch" "FAIL" "synth exit $rc; $(tail -n 1 "$XMC_LOG" | cut -c1-120)"
  elif [ $t -lt 30 ]; then
    row "xmc epoch" "SKIP" "no time left"
  else
    # First the step's profile (each op on the device's clock), for a model
    # of the shape train makes by default from these flags, so that a slow
    # epoch shows where its time goes.
    echo '{"input": {"kind": "sparse"}, "layers": [{"type": "linear", "width": '"$XMC_HIDDEN"', "activation": "relu"}, {"type": "dropout", "p": 0.3}, {"type": "ffi", "fan_in": 32}], "loss": "bce", "batch": '"${POOCH_XMC_BATCH:-32}"', "topk": 5, "seed": 1}' > "$TMPD/xmc-spec.json"
    echo "== pooch-run profile --spec $(cat "$TMPD/xmc-spec.json")" >> "$XMC"
    timeout $(( t < 60 ? t : 60 )) "$BIN/pooch-run" profile --spec "$TMPD/xmc-spec.json" --data "$XMC_DATA" \
      --device cuda --device-memory 4G --runs 5 >> "$XMC" 2>&1
    echo "== exit $?" >> "$XMC"
    t=$(( $(left) - 40 ))
    [ $t -gt 150 ] && t=150
    if [ $t -lt 30 ]; then
      row "xmc epoch" "SKIP" "no time left after the profile"
    else
      XMC_ARGS=(train --data "$XMC_DATA" --device cuda --device-memory 4G --epochs 1
                --hidden "$XMC_HIDDEN" --fan-in 32 --out "$TMPD/xmc.pooch" --json)
      [ -n "${POOCH_XMC_BATCH:-}" ] && XMC_ARGS+=(--batch "$POOCH_XMC_BATCH")
      echo "== pooch-run ${XMC_ARGS[*]}" >> "$XMC"
      timeout $t "$BIN/pooch-run" "${XMC_ARGS[@]}" >> "$XMC" 2>&1
      rc=$?
      echo "== exit $rc" >> "$XMC"
      # The last line is the --json object; its scalars (and the arena) make the row.
      brief=$(grep -E '^\{' "$XMC" | tail -n 1 | timeout 10 python3 -c '
import json, sys
try:
    j = json.loads(sys.stdin.read())
except Exception:
    sys.exit(0)
parts = []
for k in ("steps", "seconds"):
    if isinstance(j.get(k), (int, float)):
        parts.append("%s=%.4g" % (k, j[k]))
ep = j.get("epochs")
if isinstance(ep, list) and ep and isinstance(ep[-1], dict) and "loss" in ep[-1]:
    parts.append("loss=%.4g" % ep[-1]["loss"])
fin = j.get("final") if isinstance(j.get("final"), dict) else {}
prec = fin.get("precision")
if isinstance(prec, list) and len(prec) >= 3:
    parts.append("P@1/3=%.4f/%.4f" % (prec[0], prec[2]))
m = j.get("memory") if isinstance(j.get("memory"), dict) else {}
if isinstance(m.get("arena_bytes"), (int, float)):
    parts.append("arena=%.2fGiB" % (m["arena_bytes"] / 2**30))
print(" ".join(parts))' 2>/dev/null)
      case $rc in
        0) row "xmc epoch" "ok" "scale $XMC_SCALE; $(echo "$brief" | cut -c1-140)" ;;
        124) STATUS=1; row "xmc epoch" "TIMEOUT" "after ${t}s at scale $XMC_SCALE (xmc.txt has what ran)" ;;
        *) STATUS=1; row "xmc epoch" "FAIL" "exit $rc; $(grep -m1 -iE 'error|fail' "$XMC" | cut -c1-120)" ;;
      esac
    fi
  fi
  say "xmc epoch done"
fi

# ---- 10. GPT-2 774M (full) and 1.5B (LoRA) on 4 GB and 8 GB, when asked --------------
for model in gpt-large gpt-xl-lora; do
  ooc_row 10 $model "$model cards" 8 20 260 60
done

# ---- 6, continued: bench/ooc's tables on the card, time permitting ---------------------
# Every strategy at 1/2, 1/3 and 1/5 of the in-core arena, and the CNNs'
# activations 2, 3 and 5 times oversubscribed; its own link, no emulation;
# appended to ooc.txt. After steps 7 and 8, which have never run, so that
# it takes only what they leave; a run cut off by its timeout is partial,
# not a failure (line-buffered, so what it printed is kept).
t=$(( $(left) - 40 ))
[ $t -gt 90 ] && t=90
if may_run 6 "ooc bench" pooch-bench-ooc 30 $t; then
  echo "== pooch-bench-ooc --device cuda --steps 7 (then --cnn --activations)" >> "$OUT/ooc.txt"
  timeout $t stdbuf -oL -eL bash -c \
    '"$1" --device cuda --steps 7 && "$1" --device cuda --steps 7 --cnn --activations' \
    _ "$BIN/pooch-bench-ooc" > "$TMPD/ooc_bench.txt" 2>&1
  rc=$?
  cat "$TMPD/ooc_bench.txt" >> "$OUT/ooc.txt"
  brief=$(grep -E '^auto +(a)?1/3 ' "$TMPD/ooc_bench.txt" | awk '{print $(NF-2)}' | tr '\n' ' ')
  case $rc in
    0) row "ooc bench" "ok" "auto at 1/3 (each model): ${brief:-?}(ooc.txt)" ;;
    124) row "ooc bench" "PARTIAL" "cut off after ${t}s; auto at 1/3: ${brief:-none yet} (ooc.txt)" ;;
    *) STATUS=1; row "ooc bench" "FAIL" "exit $rc; $(grep -m1 -iE 'error|pooch-bench-ooc:' "$TMPD/ooc_bench.txt" | cut -c1-120)" ;;
  esac
  say "ooc bench exit $rc"
fi

# ---- 9. memory checker on small shapes (into opcheck_cuda.txt) -------------------------
t=$(( $(left) - 5 ))
[ $t -gt 90 ] && t=90
SANITIZER=$(command -v compute-sanitizer)
if [ -z "$SANITIZER" ]; then
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer; do
    if [ -x "$c" ]; then SANITIZER=$c; break; fi
  done
fi
MEMCHECK=$TMPD/memcheck.txt
if ! wanted 9; then
  :
elif [ -z "$SANITIZER" ]; then
  row "memcheck" "SKIP" "compute-sanitizer not found"
elif [ $t -lt 30 ]; then
  row "memcheck" "SKIP" "no time left"
else
  timeout $t "$SANITIZER" --tool memcheck --leak-check no --error-exitcode 9 \
    "$BIN/pooch-bench-cuda" --quick > "$MEMCHECK" 2>&1
  rc=$?
  { echo; echo "== compute-sanitizer --tool memcheck pooch-bench-cuda --quick (exit $rc)"
    cat "$MEMCHECK"; } >> "$OUT/opcheck_cuda.txt"
  errs=$(grep -m1 -E 'ERROR SUMMARY' "$MEMCHECK")
  case $rc in
    0) row "memcheck" "ok" "${errs:-no errors} (bench --quick)" ;;
    77) row "memcheck" "SKIP" "no CUDA device" ;;
    9) STATUS=1; row "memcheck" "FAIL" "$errs; $(grep -m1 -E 'Invalid|out of bounds|Address' "$MEMCHECK" | cut -c1-120)" ;;
    124) row "memcheck" "TIMEOUT" "after ${t}s (slow under the tool; not a failure)" ;;
    *) if grep -qiE 'not supported|LibraryNotLoaded|error 999' "$MEMCHECK"; then
         row "memcheck" "SKIP" "the tool does not work on this machine"
       else
         STATUS=1; row "memcheck" "FAIL" "exit $rc; $errs"
       fi ;;
  esac
fi

finish
