#!/usr/bin/env bash
# Kill and resume: `pooch-run train --checkpoint c.pooch` killed with SIGKILL
# at pseudo-random moments (a fixed seed, so every run of the test kills at
# the same offsets): while loading, mid-epoch, during a checkpoint write.
# After every kill:
#   - the checkpoint is absent (killed before the first one was written) or
#     loads (`pooch-run info` exits 0): never a torn file;
#   - a run resumed from it (--resume) finishes, and the model it writes is
#     byte-identical to the one an uninterrupted run writes.
# The killed runs form a chain (each starts from the checkpoint the last one
# left); the final model, after the last resume, must equal the
# uninterrupted one too, and no temporary file may be left behind.
# Usage: test_kill_resume.sh PATH/TO/pooch-run [KILLS (default 10)] [SEED (default 12)]
set -uo pipefail

RUN=${1:?usage: test_kill_resume.sh PATH/TO/pooch-run [KILLS] [SEED]}
RUN=$(cd "$(dirname "$RUN")" && pwd)/$(basename "$RUN")
KILLS=${2:-10}
RANDOM=${3:-12}  # seeds bash's generator: the kill moments are fixed
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cli_scratch kill

# Many short epochs: a checkpoint is written after each, so a kill often
# lands in or near a write (about 50 ms per epoch, 2 s in all). The plateau
# schedule stays on (its state is part of what a checkpoint must carry);
# early stopping is off so that every run is as long.
FLAGS=(--data data --epochs 40 --early-stop 0 --plateau-patience 2 --hidden 32 --fan-in 8 --batch 32 --seed 7
  --threads 1 --device cpu)
"$RUN" synth --preset EURLex-4K --scale 0.1 --seed 3 --out data > synth.log 2>&1 ||
  { echo "FAIL synth"; cat synth.log; exit 1; }

start_ns=$(date +%s%N)
if "$RUN" train "${FLAGS[@]}" --out ref.pooch --checkpoint ref.ckpt > ref.log 2>&1; then
  pass "uninterrupted run"
else
  fail "uninterrupted run"
  tail -5 ref.log
  exit 1
fi
ref_ms=$((($(date +%s%N) - start_ns) / 1000000))
echo "     uninterrupted run: ${ref_ms} ms"

# A resumed copy of checkpoint $1 runs to the end; its model must equal ref.pooch.
verified=()
resume_to_end() {
  local ckpt=$1 tag=$2
  for v in "${verified[@]+"${verified[@]}"}"; do
    if cmp -s "$ckpt" "$v"; then
      pass "$tag: resumed (same checkpoint as one already resumed)"
      return
    fi
  done
  cp "$ckpt" "v$tag.ckpt"
  verified+=("v$tag.ckpt")
  if "$RUN" train "${FLAGS[@]}" --out "v$tag.pooch" --checkpoint "v$tag.ckpt" \
    --resume "v$tag.ckpt" > "v$tag.log" 2>&1; then
    if cmp -s ref.pooch "v$tag.pooch"; then pass "$tag: resumed to the end, same bytes"; else
      fail "$tag: the resumed run's model differs from the uninterrupted one"
    fi
  else
    fail "$tag: resuming failed (exit $?)"
    tail -3 "v$tag.log" | sed 's/^/    | /'
  fi
  # Keep the copy for the comparison above (the run wrote its own checkpoint
  # over it: compare against the checkpoint as it was).
  cp "$ckpt" "v$tag.ckpt"
}

# Kill moments: 0.05 s up to about the length of the uninterrupted run, so
# that a chain of killed runs makes progress and kills land in every phase.
span_ms=$((ref_ms < 400 ? 400 : ref_ms))
finished=0
for i in $(seq 1 "$KILLS"); do
  delay_ms=$((50 + RANDOM % span_ms))
  resume=()
  [ -e c.pooch ] && resume=(--resume c.pooch)
  "$RUN" train "${FLAGS[@]}" --out k.pooch --checkpoint c.pooch "${resume[@]}" \
    > "k$i.log" 2>&1 &
  pid=$!
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  if kill -KILL "$pid" 2> /dev/null; then
    wait "$pid" 2> /dev/null
    what="killed after ${delay_ms} ms"
  else
    wait "$pid"
    rc=$?
    what="finished before the kill at ${delay_ms} ms (exit $rc)"
    finished=$((finished + 1))
  fi
  if [ ! -e c.pooch ]; then
    pass "kill $i: $what; no checkpoint yet"
    continue
  fi
  if "$RUN" info c.pooch > "info$i.log" 2>&1; then
    pass "kill $i: $what; the checkpoint loads ($(grep -Eo 'train\.step +[0-9]+' "info$i.log" | tr -s ' '))"
  else
    fail "kill $i: $what; the checkpoint does not load"
    tail -3 "info$i.log" | sed 's/^/    | /'
    continue
  fi
  resume_to_end c.pooch "$i"
  # A finished run started over would only repeat itself: start the chain again.
  [ -e k.pooch ] && rm -f c.pooch k.pooch
done
[ "$finished" -lt "$KILLS" ] && pass "kills landed ($((KILLS - finished)) of $KILLS)" ||
  fail "every run finished before its kill: the kills tested nothing"

# The chain's last resume, to the end.
resume=()
[ -e c.pooch ] && resume=(--resume c.pooch)
if "$RUN" train "${FLAGS[@]}" --out final.pooch --checkpoint c.pooch "${resume[@]}" \
  > final.log 2>&1; then
  pass "final resume finished"
else
  fail "final resume: exit $?"
  tail -3 final.log | sed 's/^/    | /'
fi
if cmp ref.pooch final.pooch; then pass "final model byte-identical"; else
  fail "final model differs from the uninterrupted run's"
fi
leftovers=$(ls | grep -E '\.tmp-[0-9]+' || true)
[ -z "$leftovers" ] && pass "no temporary files left" || fail "temporary files left: $leftovers"

finish
