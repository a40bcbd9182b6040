#!/bin/bash
# sp-run --device cuda end to end (label gpu): the default model compiled
# with the paper's attention ops, trained 20 steps on the GPU and on the CPU
# from the same data. A smoke test of the tool's CUDA path (its first run
# crashed before the executor took the backend); the numerics are checked by
# sp-gpu-tests. Exits 77 (skipped) without a usable GPU.
#   check_sp_run_cuda.sh BIN_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
BIN=$1 SRC=$2 WORK=$3
rm -rf "$WORK" && mkdir -p "$WORK"
"$BIN/sp-compile" "$SRC/models/tiny/gpt-tiny.onnx" --attention unfused -o "$WORK/plan" --quiet
"$BIN/sp-tokenize" "$SRC/models/data/python-reference.txt" -o "$WORK/data.bin" > /dev/null
run() {
  "$BIN/sp-run" "$WORK/plan" --data "$WORK/data.bin" --steps 20 --device "$1" --log-dir "$WORK/log-$1" 2>&1
}
if ! GPU=$(run cuda); then
  echo "$GPU"
  if grep -q "no CUDA device is visible\|has no CUDA" <<<"$GPU"; then
    echo "skipped: no usable CUDA device"
    exit 77
  fi
  exit 1
fi
CPU=$(run cpu)
loss() { sed -n 's/.*final loss \([0-9.]*\),.*/\1/p' <<<"$1"; }
G=$(loss "$GPU") C=$(loss "$CPU")
echo "final loss: cuda $G, cpu $C"
# The same plan, data and dropout keys: the losses agree to the printed
# digits but for GEMM rounding; 1e-3 relative is a sanity bound only.
awk -v g="$G" -v c="$C" 'BEGIN { d = g - c; if (d < 0) d = -d; exit !(g != "" && d <= 1e-3 * c) }'
