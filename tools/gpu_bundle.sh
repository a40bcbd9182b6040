#!/bin/bash
# Packs a CUDA build for a GPU machine that has the NVIDIA driver, cuBLAS and
# NCCL but not this project's build dependencies (a cloud GPU image, a
# container): the tools and the GPU tests, stripped, with the shared
# libraries they need that such a machine usually lacks (OpenBLAS, ONNX,
# protobuf, Open MPI, ...; the C and C++ runtimes are the machine's), and
# the CUDA runtime they were built against. cuBLAS and NCCL are not packed
# (hundreds of MB); tools/gpu_check.sh finds the machine's.
#
#   tools/gpu_bundle.sh [BUILD_DIR] [OUT.tar.gz]     (default: build, gpu-bundle.tar.gz)
#
# This is how the H200 numbers in docs/benchmarks.md were produced: the build of
# this Debian 12 machine, carried to the GPU machine with the repository.
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-gpu-bundle.tar.gz}
BIN="$BUILD/bin"
for T in sp-run sp-compile sp-tokenize sp-gpu-tests; do
  [[ -x "$BIN/$T" ]] || { echo "gpu_bundle.sh: $BIN/$T is missing (build with CUDA first: tools/dev.sh build)" >&2; exit 1; }
done
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib"
cp "$BIN/sp-run" "$BIN/sp-compile" "$BIN/sp-tokenize" "$BIN/sp-gpu-tests" "$STAGE/bin/"
strip "$STAGE"/bin/*
ldd "$BIN/sp-run" "$BIN/sp-compile" "$BIN/sp-gpu-tests" | awk '$3 ~ /^\// {print $3}' | sort -u |
  while read -r L; do
    case $(basename "$L") in
      libc.so*|libm.so*|libstdc++*|libgcc_s*|libdl.so*|libpthread*|librt.so*) ;;
      libcublas*|libnccl*) ;;
      *) cp -L "$L" "$STAGE/lib/" ;;
    esac
  done
tar -C "$STAGE" -czf "$OUT" bin lib
echo "wrote $OUT ($(du -h "$OUT" | cut -f1)): $(ls "$STAGE/lib" | tr '\n' ' ')"
