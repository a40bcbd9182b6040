#!/usr/bin/env bash
# Configures an instrumented build with Debian's clang-14, the one way both
# tests/sanitize.sh and tests/fuzz/run_fuzz.sh make theirs:
#
#   tests/configure_sanitized.sh fuzz DIR     ASan + UBSan + libFuzzer's
#       coverage (SP_FUZZ=ON): the fuzz targets and, in the same tree, the
#       unit tests under ASan + UBSan (tests/sanitize.sh address)
#   tests/configure_sanitized.sh thread DIR   TSan (SP_SANITIZE=thread)
#
# Both are unity builds at -O2 with line tables only (what a report's stack
# needs), assertions on, CUDA left out (nvcc takes no -fsanitize), through
# ccache when it is installed. Configured on every run (seconds), so the
# flags are always those written here; the build itself is incremental.
# Clang, not GCC: GCC took 10 minutes for the ASan unit-test build alone, clang
# about 6 for the fuzz targets and the unit tests together.
set -euo pipefail

cd "$(dirname "$0")/.."
if [ $# -ne 2 ]; then
  echo "usage: tests/configure_sanitized.sh fuzz|thread DIR" >&2
  exit 2
fi
case "$1" in
  fuzz) FLAVOUR=(-DSP_FUZZ=ON -DSP_SANITIZE=) ;;
  thread) FLAVOUR=(-DSP_FUZZ=OFF -DSP_SANITIZE=thread) ;;
  *)
    echo "tests/configure_sanitized.sh: unknown flavour '$1' (fuzz, thread)" >&2
    exit 2
    ;;
esac
DIR=$2

CXX=/usr/bin/clang++-14
CC=/usr/bin/clang-14
if [ ! -x "$CXX" ] || ! ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "tests/configure_sanitized.sh: needs clang-14 and its sanitizer runtimes:" \
    "apt-get install clang-14 libclang-rt-14-dev" >&2
  exit 2
fi

echo "== configuring $DIR (clang-14, $1)"
cmake -S . -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_UNITY_BUILD=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only" \
  -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" "${FLAVOUR[@]}" \
  -DSP_ENABLE_CUDA=OFF \
  $(command -v ccache >/dev/null && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache) >/dev/null
