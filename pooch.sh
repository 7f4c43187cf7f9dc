#!/usr/bin/env bash
# pooch.sh demo | test | bench — set up a fresh Debian 12 machine (installing
# what is missing), build, and run the main job, the test suite or the
# benchmarks.
set -euo pipefail
cd "$(dirname "$0")"

BUILD=${POOCH_BUILD:-build}
DEBIAN_PACKAGES=(
  meson ninja-build pkg-config g++
  libopenblas-dev libopenblas0-pthread libmimalloc-dev libfmt-dev libcli11-dev
  nlohmann-json3-dev libxxhash-dev libgtest-dev libpcre2-dev libdnnl-dev
)

# Only the benchmarks need these: the peer (Debian's PyTorch, which multiplies
# through OpenBLAS once libopenblas0-pthread is installed) and GNU time for
# peak memory.
BENCH_PACKAGES=(python3-torch python3-numpy time)

as_root() {
  if [ "$(id -u)" = 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "pooch.sh: installing packages needs root: run this as root, or install sudo" >&2
    exit 1
  fi
}

install_missing() {
  if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "pooch.sh: not a Debian system: install the dependencies in docs/BUILD.md yourself" >&2
    return 0
  fi
  local missing=()
  for p in "${DEBIAN_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "pooch.sh: installing ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  fi
}

# The CUDA toolkit lives in /usr/local/cuda on these machines; put nvcc on
# PATH when it is there so that -Dcuda=auto finds it.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

configure_and_build() {
  if [ ! -f "$BUILD/build.ninja" ]; then
    meson setup "$BUILD" --buildtype=release
  fi
  ninja -C "$BUILD"
}

cmd=${1:-}
case "$cmd" in
  demo)
    install_missing
    configure_and_build
    shift
    "$BUILD/apps/pooch-run" demo "$@"
    ;;
  test)
    install_missing
    configure_and_build
    meson test -C "$BUILD" --print-errorlogs
    ;;
  bench)
    install_missing "${BENCH_PACKAGES[@]}"
    configure_and_build
    "$BUILD/tests/pooch-opcheck" --bench
    /usr/bin/python3 bench/xmc/run.py --build "$BUILD"
    "$BUILD/bench/pooch-bench-ooc"
    /usr/bin/python3 bench/lm/run.py --build "$BUILD"
    ;;
  *)
    echo "usage: ./pooch.sh demo [demo flags] | test | bench" >&2
    exit 1
    ;;
esac
