#!/bin/sh
# Regenerates the committed default model, models/tiny/gpt-tiny.onnx and its .json:
# a byte-level (vocab 256) GPT with L=2, h=64, 4 heads, s=64, batch 4, opset 17, tied
# embeddings, erf GELU, buffer mask, dropout 0.1, seed 1234, static shapes.
#
#   sh models/make_default.sh        (PYTHON=... to use another interpreter with torch)
set -eu
cd "$(dirname "$0")"
mkdir -p tiny
"${PYTHON:-/usr/bin/python3}" export_gpt.py -o tiny/gpt-tiny.onnx \
    --vocab 256 --hidden 64 --heads 4 --layers 2 --seq 64 --batch 4 --opset 17 \
    --tied --gelu erf --layernorm module --linear matmul --mask buffer --scale div \
    --dropout 0.1 --seed 1234
