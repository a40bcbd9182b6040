#!/bin/sh
# Exports the model families users bring, small, into DIR (models/export_family.py:
# HF-style GPT-2, Llama with grouped-query heads and a padding mask, a BERT
# encoder) and prints their paths, colon-separated, for the tests that train
# them (check_expanded_plans.sh, check_emulated_grids.sh).
#
#   export_families.sh PYTHON SOURCE_DIR DIR
set -eu
PY=$1 SRC=$2 DIR=$3
"$PY" "$SRC/models/export_family.py" --family gpt2 -o "$DIR/gpt2.onnx" \
  --layers 2 --hidden 32 --heads 4 --seq 16 --batch 2 --vocab 64 > /dev/null
"$PY" "$SRC/models/export_family.py" --family llama -o "$DIR/llama.onnx" \
  --layers 2 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --batch 2 \
  --vocab 64 --input-name input_ids --attention-mask input --opset 14 > /dev/null
"$PY" "$SRC/models/export_family.py" --family bert -o "$DIR/bert.onnx" \
  --layers 2 --hidden 32 --heads 4 --seq 16 --batch 2 --vocab 64 \
  --input-name input_ids > /dev/null
echo "$DIR/gpt2.onnx:$DIR/llama.onnx:$DIR/bert.onnx"
