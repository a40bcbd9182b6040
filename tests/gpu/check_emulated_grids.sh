#!/bin/sh
# Exports an 8-layer GPT (models/export_gpt.py) and the model families users
# bring (models/export_family.py: HF-style GPT-2, Llama with grouped-query
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
"$PY" "$SRC/models/export_family.py" --family gpt2 -o "$WORK/gpt2.onnx" \
  --layers 2 --hidden 32 --heads 4 --seq 16 --batch 2 --vocab 64 > /dev/null
"$PY" "$SRC/models/export_family.py" --family llama -o "$WORK/llama.onnx" \
  --layers 2 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --batch 2 \
  --vocab 64 --input-name input_ids --attention-mask input --opset 14 > /dev/null
"$PY" "$SRC/models/export_family.py" --family bert -o "$WORK/bert.onnx" \
  --layers 2 --hidden 32 --heads 4 --seq 16 --batch 2 --vocab 64 \
  --input-name input_ids > /dev/null
# run TEST: a skipped test would pass too, so make sure it ran.
run() {
  SP_EMULATED_GPT="$WORK/gpt8.onnx" \
  SP_EMULATED_FAMILIES="$WORK/gpt2.onnx:$WORK/llama.onnx:$WORK/bert.onnx" \
    "$TESTS" --gtest_filter="$1" > "$WORK/out.txt" 2>&1 ||
    { cat "$WORK/out.txt"; exit 1; }
  cat "$WORK/out.txt"
  grep -q "^\[       OK \] $1" "$WORK/out.txt"
}
run EmulatedCuda.SchedulesRecomputationAndAttentionOnGrids
run EmulatedCuda.ExportedFamiliesOnGrids
