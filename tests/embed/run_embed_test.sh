#!/usr/bin/env bash
# The embedding test: installs the build into a temporary DESTDIR, builds
# apps/examples/embed.c against the INSTALLED library through pkg-config
# (as a user of the library would), makes a tiny model with the installed
# pooch-run, and checks embed's predictions; then builds and runs
# apps/examples/mlp.c (tensor-level calls: a dense model trained in C).
# Usage: run_embed_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail

BUILD=$(cd "${1:?usage: run_embed_test.sh BUILD_DIR SOURCE_DIR}" && pwd)
SRC=$(cd "${2:?usage: run_embed_test.sh BUILD_DIR SOURCE_DIR}" && pwd)
MESON=${MESON:-meson}
CC=${CC:-cc}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/pooch-embed.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
DEST=$TMP/dest

# Where the build installs to (prefix, libdir, bindir as configured).
option() {
  "$MESON" introspect "$BUILD" --buildoptions |
    python3 -c "import json, sys; print(next(o['value'] for o in json.load(sys.stdin) if o['name'] == '$1'))"
}
PREFIX=$(option prefix)
LIBDIR=$(option libdir)
BINDIR=$(option bindir)
case "$LIBDIR" in /*) ;; *) LIBDIR=$PREFIX/$LIBDIR ;; esac
case "$BINDIR" in /*) ;; *) BINDIR=$PREFIX/$BINDIR ;; esac

echo "== meson install --destdir $DEST (prefix $PREFIX)"
if ! "$MESON" install -C "$BUILD" --no-rebuild --destdir "$DEST" > "$TMP/install.log" 2>&1; then
  tail -20 "$TMP/install.log"
  echo "FAIL: meson install"
  exit 1
fi
PC_DIR=$DEST$LIBDIR/pkgconfig
for f in "$PC_DIR/pooch.pc" "$DEST$PREFIX/include/pooch/pooch.h" \
  "$DEST$PREFIX/include/pooch/pooch_version.h" "$DEST$BINDIR/pooch-run"; do
  [ -e "$f" ] || { echo "FAIL: the install lacks $f"; exit 1; }
done
ls "$DEST$LIBDIR"/libpooch.so.* > /dev/null || { echo "FAIL: no libpooch.so.* installed"; exit 1; }

# pkg-config against the staged tree: the sysroot prefixes the .pc file's
# -I and -L paths with DESTDIR.
export PKG_CONFIG_PATH=$PC_DIR
export PKG_CONFIG_SYSROOT_DIR=$DEST
FLAGS=$(pkg-config --cflags --libs pooch)
echo "== pkg-config --cflags --libs pooch: $FLAGS"
# pooch.pc serves every user of the shared library: it must resolve with no
# other package's .pc file (pooch's dependencies may have come from a wrap
# and are not installed), so it names nothing private.
PC=$PC_DIR/pooch.pc
if ! PKG_CONFIG_LIBDIR=$PC_DIR pkg-config --cflags --libs pooch > /dev/null; then
  cat "$PC"
  echo "FAIL: pkg-config --cflags --libs pooch needs other packages' .pc files"
  exit 1
fi
if grep -Ei '^(Requires(\.private)?|Libs\.private):' "$PC" |
  grep -Eiq 'fmt|xxhash|nlohmann|json|mimalloc|cli11|gtest|openblas|openmp|pooch_|\.so|\.a\b'; then
  cat "$PC"
  echo "FAIL: pooch.pc names internal or wrapped packages"
  exit 1
fi
[ "$(pkg-config --modversion pooch)" = "$("$MESON" introspect "$BUILD" --projectinfo |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')" ] ||
  { echo "FAIL: pooch.pc's version is not the project's"; exit 1; }
echo "== $CC -std=c11 embed.c"
# shellcheck disable=SC2086
"$CC" -std=c11 -Wall -Wextra -Werror -pedantic "$SRC/apps/examples/embed.c" $FLAGS -o "$TMP/embed"

export LD_LIBRARY_PATH=$DEST$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The binary must resolve libpooch from the staged install, not the build tree.
if command -v ldd > /dev/null; then
  ldd "$TMP/embed" | grep -F "libpooch.so" | grep -qF "$DEST" ||
    { echo "FAIL: embed does not load the installed libpooch"; ldd "$TMP/embed"; exit 1; }
fi

RUN=$DEST$BINDIR/pooch-run
cd "$TMP"
echo "== a tiny model with the installed pooch-run"
"$RUN" synth --preset EURLex-4K --scale 0.02 --seed 2 --out data > synth.log
"$RUN" train --data data --epochs 1 --out tiny.pooch --device cpu --threads 1 > train.log ||
  { tail -5 train.log; echo "FAIL: training the tiny model"; exit 1; }

echo "== embed tiny.pooch data/test.txt 4"
"$TMP/embed" tiny.pooch data/test.txt 4 | tee embed.out
# One version line, then 4 rows of 3 label:score pairs and the true labels.
[ "$(grep -c '^row ' embed.out)" = 4 ] || { echo "FAIL: wanted 4 rows"; exit 1; }
if ! grep '^row ' embed.out |
  awk '{ if ($2 !~ /^[0-9]+:$/ || NF < 6) exit 1
         for (i = 3; i <= 5; ++i) if ($i !~ /^[0-9]+:-?[0-9.]+(e[-+][0-9]+)?$/) exit 1
         if ($6 != "(true:") exit 1 }'; then
  echo "FAIL: embed's output is not 'row N: l:s l:s l:s (true: ...)'"
  exit 1
fi
# The same top-3 as pooch-run predict gives for those rows.
# (Into a file: piped into head, predict could die of SIGPIPE, failing under pipefail.)
"$RUN" predict --model tiny.pooch --input data/test.txt --k 3 --device cpu --threads 1 --out cli.preds > /dev/null
head -n 4 cli.preds | awk '{ for (i = 1; i <= NF; ++i) { split($i, a, ":"); printf "%s%s", (i > 1 ? " " : ""), a[1] } print "" }' \
  > cli.labels
grep '^row ' embed.out |
  awk '{ for (i = 3; i <= 5; ++i) { split($i, a, ":"); printf "%s%s", (i > 3 ? " " : ""), a[1] } print "" }' \
  > embed.labels
if ! cmp -s cli.labels embed.labels; then
  echo "FAIL: embed and pooch-run predict disagree"
  paste cli.labels embed.labels
  exit 1
fi
# A bad model path is reported, not a crash.
if "$TMP/embed" no-such.pooch data/test.txt > /dev/null 2> err.txt; then
  echo "FAIL: embed succeeded on a missing model"
  exit 1
fi
grep -q "no-such.pooch" err.txt || { echo "FAIL: no message naming the missing model"; exit 1; }

echo "== $CC -std=c11 mlp.c"
# shellcheck disable=SC2086
"$CC" -std=c11 -Wall -Wextra -Werror -pedantic "$SRC/apps/examples/mlp.c" $FLAGS -lm -o "$TMP/mlp"
echo "== mlp 12"
"$TMP/mlp" 12 | tee mlp.out || { echo "FAIL: mlp exited with an error"; exit 1; }
# Its inputs and outputs, one line per epoch, a loss that halved at least.
for want in '^family mlp$' '^input batch\.x: f32 \[batch\(32\), 4\], 512 bytes$' \
  '^input batch\.y: f32 \[batch\(32\), 2\]' '^output prediction: f32 \[batch\(32\), 2\]' \
  '^output loss: f32 \[\]' '^row 2: predicted ' ': ok$'; do
  grep -Eq -- "$want" mlp.out || { echo "FAIL: no line matching '$want' in mlp's output"; exit 1; }
done
[ "$(grep -c '^epoch [0-9]* loss [0-9.]*$' mlp.out)" = 12 ] || { echo "FAIL: wanted 12 epoch lines"; exit 1; }
echo "embed test passed"
