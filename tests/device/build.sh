#!/usr/bin/env bash
# Builds, on this (GPU-less) machine, the binaries that tests/device/run.sh
# runs on a lent GPU machine, whose system libraries differ from ours and
# where nothing can be installed:
#
#   build-device/dist/bin/  pooch-opcheck, test_cuda_backend, pooch-bench-cuda
#   build-device/dist/lib/  every shared library they need that is neither
#                           glibc/libstdc++ nor a CUDA library (fmt, mimalloc,
#                           libgomp, ...): the GPU machine provides those two
#   build-device/dist/lib-fallback/  this machine's libstdc++ and libgcc_s, which
#                           run.sh uses only if the GPU machine's are older
#   build-device/dist/BUILD.txt  what was built, from which commit, and ldd
#
# Static where available (-Dprefer_static=true: OpenBLAS, libgfortran); the
# CUDA runtime, cuBLAS and cuSPARSE stay shared (CUDA 13's, found on the GPU
# machine, where they match its driver).
# Then call the device tool with carry: ["build-device/dist"] and the
# command `bash tests/device/run.sh`.
#
# usage: tests/device/build.sh            (JOBS=N to build with N jobs; default 1)
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${POOCH_DEVICE_BUILD:-build-device}
DIST=$BUILD/dist
TARGETS=(tests/pooch-opcheck tests/test_cuda_backend bench/pooch-bench-cuda)

if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" --buildtype=release -Dcuda=enabled -Dtests=true -Dbench=true \
    -Dprefer_static=true -Dcuda-arch=75,90
fi
ninja -C "$BUILD" -j"${JOBS:-1}" "${TARGETS[@]}"

rm -rf "$DIST"
mkdir -p "$DIST/bin" "$DIST/lib"
for t in "${TARGETS[@]}"; do
  cp "$BUILD/$t" "$DIST/bin/"
  strip --strip-unneeded "$DIST/bin/$(basename "$t")"
done

# Libraries the GPU machine has in its own (newer) versions: glibc and the
# C++ runtime, and the CUDA libraries, which must match its driver.
system_lib() {
  case "$1" in
    linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libdl.so* | librt.so* | \
      libpthread.so* | libstdc++.so* | libgcc_s.so*) return 0 ;;
    libcuda.so* | libcudart.so* | libcublas*.so* | libcusparse*.so* | libnvJitLink*.so* | \
      libcudnn*.so*) return 0 ;;
  esac
  return 1
}

for b in "$DIST"/bin/*; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    system_lib "$name" && continue
    if [ "$path" = "not" ]; then
      echo "build.sh: $(basename "$b") needs $name, which is not found here" >&2
      exit 1
    fi
    [ -f "$DIST/lib/$name" ] || cp -L "$path" "$DIST/lib/$name"
  done < <(ldd "$b")
done

# The build's C++ runtime, used by run.sh only if the GPU machine's is older.
mkdir -p "$DIST/lib-fallback"
for name in libstdc++.so.6 libgcc_s.so.1; do
  path=$(ldd "$DIST/bin/pooch-opcheck" | awk -v n="$name" '$1 == n { print $3 }')
  [ -n "$path" ] && cp -L "$path" "$DIST/lib-fallback/$name"
done

{
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) from $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  nvcc --version | tail -n 2
  for b in "$DIST"/bin/*; do
    echo "== ldd $(basename "$b")"
    ldd "$b"
  done
  echo "== bundled"
  ls -la "$DIST/lib"
} > "$DIST/BUILD.txt"
du -sh "$DIST"
echo "build.sh: $DIST ready; carry it as \"$DIST\" and run: bash tests/device/run.sh"
