#!/bin/sh
# Exports an 8-layer GPT (models/export_gpt.py) and the model families users
# bring (export_families.sh: HF-style GPT-2, Llama with grouped-query
# heads and a padding mask, a BERT encoder), and trains them on grids of
# emulated GPUs: the whole CUDA backend over the emulated CUDA runtime,
# NCCL and cuBLAS (EmulatedBackendTest.cpp), against CPU thread ranks.
#
#   check_emulated_grids.sh PYTHON SOURCE_DIR EMULATED_GPU_TESTS WORK_DIR
set -eu
PY=$1 SRC=$2 TESTS=$3 WORK=$4
rm -rf "$WORK"
mkdir -p "$WORK"
"$PY" "$SRC/models/export_gpt.py" -o "$WORK/gpt8.onnx" --layers 8 \
  --hidden 32 --heads 4 --seq 16 --vocab 64 --batch 2 --dropout 0.1 > /dev/null
FAMILIES=$("$(dirname "$0")/export_families.sh" "$PY" "$SRC" "$WORK")
# run TEST: a skipped test would pass too, so make sure it ran.
run() {
  SP_EMULATED_GPT="$WORK/gpt8.onnx" \
  SP_EMULATED_FAMILIES="$FAMILIES" \
    "$TESTS" --gtest_filter="$1" > "$WORK/out.txt" 2>&1 ||
    { cat "$WORK/out.txt"; exit 1; }
  cat "$WORK/out.txt"
  grep -q "^\[       OK \] $1" "$WORK/out.txt"
}
run EmulatedCuda.SchedulesRecomputationAndAttentionOnGrids
run EmulatedCuda.ExportedFamiliesOnGrids
run EmulatedCuda.LinearBiasesInTheEpilogueTrackTheCpu
