#!/usr/bin/env bash
# Builds, on this (GPU-less) machine, the binaries that tests/device/run.sh
# runs on a lent GPU machine, whose system libraries differ from ours and
# where nothing can be installed, and packs them into one archive:
#
#   build-device/dist/pooch-device.tar.xz, which holds
#     bin/           pooch-opcheck, test_cuda_backend, pooch-bench-cuda, pooch-bench-lm,
#                    pooch-bench-ooc, pooch-run
#     lib/           every shared library they need that is neither glibc/libstdc++
#                    nor a CUDA library (libpooch, fmt, mimalloc, libgomp, ...):
#                    the GPU machine provides those two
#     lib-fallback/  this machine's libstdc++ and libgcc_s, which run.sh uses
#                    only if the GPU machine's are older
#     BUILD.txt      what was built, from which commit, and ldd
#   build-device/dist/BUILD.txt  the same, readable without unpacking
#
# Packed because unpacked they would not travel: the device tool carries at
# most 64 MiB with the working tree, and the binaries (OpenBLAS linked
# statically into pooch-opcheck and libpooch) are about 170 MiB, most of it
# the same code four times (each test binary links the kernels statically)
# and oneDNN. gzip's 32 KiB window sees none of the repetition (47 MiB); xz
# with a 64 MiB dictionary does (13 MiB, about a minute to pack). run.sh unpacks the archive into a temporary folder.
#
# Static where available (-Dprefer_static=true: OpenBLAS, libgfortran). The
# CUDA runtime is always linked statically (cudart_static); cuBLAS and
# cuSPARSE are not linked at all: the CUDA backend opens them with dlopen when
# it starts, from the GPU machine's CUDA 13 (run.sh puts their folders on
# LD_LIBRARY_PATH), so they match its driver. Nothing here needs a CUDA
# library to start, which BUILD.txt's NEEDED lists show.
# Then call the device tool with carry: ["build-device/dist"] and the
# command `bash tests/device/run.sh`.
#
# usage: tests/device/build.sh            (JOBS=N to build with N jobs; default 1)
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${POOCH_DEVICE_BUILD:-build-device}
DIST=$BUILD/dist
STAGE=$BUILD/dist-stage
ARCHIVE=pooch-device.tar.xz
TARGETS=(tests/pooch-opcheck tests/test_cuda_backend bench/pooch-bench-cuda bench/pooch-bench-lm
         bench/pooch-bench-ooc apps/pooch-run)
LIMIT_MIB=40  # what the archive may take of the device tool's 64 MiB

if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" --buildtype=release -Dcuda=enabled -Dtests=true -Dbench=true \
    -Dprefer_static=true -Dcuda-arch=75,90
fi
ninja -C "$BUILD" -j"${JOBS:-1}" "${TARGETS[@]}"

rm -rf "$STAGE" "$DIST"
mkdir -p "$STAGE/bin" "$STAGE/lib" "$DIST"
for t in "${TARGETS[@]}"; do
  cp "$BUILD/$t" "$STAGE/bin/"
  # The symbol table stays (a release build has no debug information to
  # strip): run.sh's backtrace of a crash then names the functions.
  strip --strip-debug "$STAGE/bin/$(basename "$t")"
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

# ldd of the binaries where the build left them: their RUNPATH ($ORIGIN/..)
# finds the project's own shared libraries (libpooch) there, not in the copies.
for t in "${TARGETS[@]}"; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    system_lib "$name" && continue
    if [ "$path" = "not" ]; then
      echo "build.sh: $(basename "$t") needs $name, which is not found here" >&2
      exit 1
    fi
    if [ ! -f "$STAGE/lib/$name" ]; then
      cp -L "$path" "$STAGE/lib/$name"
      case "$name" in libpooch*) strip --strip-debug "$STAGE/lib/$name" ;; esac
    fi
  done < <(ldd "$BUILD/$t")
done

# The build's C++ runtime, used by run.sh only if the GPU machine's is older.
mkdir -p "$STAGE/lib-fallback"
for name in libstdc++.so.6 libgcc_s.so.1; do
  path=$(ldd "$BUILD/tests/pooch-opcheck" | awk -v n="$name" '$1 == n { print $3 }')
  if [ -n "$path" ]; then cp -L "$path" "$STAGE/lib-fallback/$name"; fi
done

{
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) from $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  nvcc --version | tail -n 2
  for t in "${TARGETS[@]}"; do
    echo "== ldd $(basename "$t")"
    ldd "$BUILD/$t"
  done
  echo "== NEEDED of libpooch (no CUDA library: cuBLAS and cuSPARSE are loaded with dlopen)"
  readelf -d "$BUILD/runtime/api/libpooch.so" | grep NEEDED
  echo "== bundled"
  ls -la "$STAGE/lib"
} > "$STAGE/BUILD.txt"
cp "$STAGE/BUILD.txt" "$DIST/BUILD.txt"

tar -C "$STAGE" -cf - bin lib lib-fallback BUILD.txt | xz -9e -T"${JOBS:-1}" > "$DIST/$ARCHIVE"
rm -rf "$STAGE"
size=$(du -m "$DIST/$ARCHIVE" | cut -f1)
du -sh "$DIST"
if [ "$size" -gt "$LIMIT_MIB" ]; then
  echo "build.sh: $DIST/$ARCHIVE is $size MiB, over $LIMIT_MIB MiB: it may not travel" >&2
  exit 1
fi
echo "build.sh: $DIST ready; carry it as \"$DIST\" and run: bash tests/device/run.sh"
