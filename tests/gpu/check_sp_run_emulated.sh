#!/bin/bash
# sp-run --device cuda on emulated GPUs (label emulated): sp-run-emulated is
# sp-run linked against the emulated CUDA runtime, NCCL and cuBLAS
# (EmulatedRuntime.h) instead of the real ones. The default model trained on
# the tool's path, thread ranks each on an emulated GPU, against sp-run
# --device cpu on the same plan and data: one device with the paper's
# attention ops; t = 2 + SP with the fused core by the blockwise kernels; and
# the 2 x 2 x 2 grid (t = 2 + SP, p = 2, d = 2 with ZeRO-1). The numerics are
# checked by sp-gpu-emulated-tests; this checks the tool's path.
#   check_sp_run_emulated.sh BIN_DIR SP_RUN_EMULATED SOURCE_DIR WORK_DIR
set -euo pipefail
BIN=$1 EMU=$2 SRC=$3 WORK=$4
rm -rf "$WORK" && mkdir -p "$WORK"
"$BIN/sp-tokenize" "$SRC/models/data/python-reference.txt" -o "$WORK/data.bin" > /dev/null
# check NAME STEPS RUN_FLAGS -- COMPILE_FLAGS...
check() {
  local Name=$1 Steps=$2 RunFlags=$3
  shift 3
  "$BIN/sp-compile" "$SRC/models/tiny/gpt-tiny.onnx" "$@" -o "$WORK/$Name" --quiet
  local Out G C
  Out=$("$EMU" "$WORK/$Name" --data "$WORK/data.bin" --steps "$Steps" --device cuda $RunFlags --log-dir "$WORK/log-$Name-cuda" 2>&1) ||
    { echo "$Out"; exit 1; }
  grep -q "the GPUs' dense GEMM peak" <<<"$Out" || { echo "$Out"; echo "not on the CUDA backend"; exit 1; }
  G=$(sed -n 's/.*final loss \([0-9.]*\),.*/\1/p' <<<"$Out")
  Out=$("$BIN/sp-run" "$WORK/$Name" --data "$WORK/data.bin" --steps "$Steps" --device cpu --log-dir "$WORK/log-$Name-cpu" 2>&1) ||
    { echo "$Out"; exit 1; }
  C=$(sed -n 's/.*final loss \([0-9.]*\),.*/\1/p' <<<"$Out")
  echo "$Name: final loss after $Steps steps: emulated cuda $G, cpu $C"
  # The same plan, data and dropout keys: the losses agree but for GEMM
  # rounding; 1e-3 relative is a sanity bound only.
  awk -v g="$G" -v c="$C" 'BEGIN { d = g - c; if (d < 0) d = -d; exit !(g != "" && d <= 1e-3 * c) }'
}
check one 20 "" --attention unfused
check tp2sp 10 "--cuda-attention blockwise" --tp 2 --sp
check grid 6 "" --tp 2 --sp --pp 2 --microbatches 2 --dp 2 --zero 1
