#!/bin/bash
# Runs the CUDA backend's checks from a tools/gpu_bundle.sh bundle, in the
# repository's root on the GPU machine (the tests read models/ and the data):
#   tests  sp-gpu-tests (every kernel against the CPU's, the end-to-end
#          comparisons), and the default model trained 20 steps by sp-run on
#          the CPU and on the GPU in each of $PRECISIONS (default fp32 bf16 fp16),
#          and with the default, fused attention core (on the GPU by the
#          blockwise kernels, and as its unfused ops, also in bf16); with two
#          or more GPUs also t = 2 + SP, p = 2 and ZB-H1 on thread ranks;
#   bench  tools/bench_gpu.py for each of $BENCH_MODELS (default 22B), with
#          $BENCH_ARGS (default --steps 8 --repeat 1 --dtype bf16);
#   all    both.
# Logs go to $OUT (default ./gpu-check). The machine's cuBLAS and NCCL are
# found under /usr/local, /opt and /usr/lib (the CUDA toolkit's, or the pip
# wheels of a PyTorch install).
#
#   tools/gpu_check.sh gpu-bundle.tar.gz [tests|bench|all]
set -uo pipefail
BUNDLE=${1:?usage: tools/gpu_check.sh BUNDLE [tests|bench|all]}
WHAT=${2:-all}
OUT=${OUT:-$PWD/gpu-check}
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }
ROOT=$(mktemp -d)
tar -xzf "$BUNDLE" -C "$ROOT"
B=$ROOT/bin
LIBS=$(find /usr/local /opt /usr/lib -xdev \( -name 'libcublas.so.1[0-9]' -o -name 'libcublasLt.so.1[0-9]' -o -name 'libnccl.so.2' \) 2>/dev/null |
       xargs -r -n1 dirname | sort -u | paste -sd:)
export LD_LIBRARY_PATH=$ROOT/lib${LIBS:+:$LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# sp-gpu-tests reads the models under the source directory it was built in.
SRC=$(strings "$B/sp-gpu-tests" | sed -n 's|^\(/.*\)/models/tiny/gpt-tiny.onnx$|\1|p' | head -1)
if [[ -n "$SRC" && "$SRC" != "$PWD" && ! -e "$SRC" ]]; then
  mkdir -p "$(dirname "$SRC")" && ln -s "$PWD" "$SRC" && say "linked $SRC -> $PWD (the tests' source directory)"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if ldd "$B/sp-run" | grep "not found"; then echo "gpu_check.sh: missing libraries (above)"; exit 1; fi
if [[ $WHAT == tests || $WHAT == all ]]; then
  say "sp-gpu-tests"
  "$B/sp-gpu-tests" --gtest_color=no 2>&1 | tee "$OUT/gpu-tests.log" | grep -vE "^\[ *(RUN|OK) |^  step [0-9]" | tail -80
  : > "$OUT/sp-run.log"
  "$B/sp-tokenize" models/data/python-reference.txt -o "$ROOT/data.bin" > /dev/null
  for P in ${PRECISIONS:-fp32 bf16 fp16}; do
    say "sp-run: the default model in $P, 20 steps on the CPU, on the GPU, and with the biases in cuBLASLt's epilogue"
    "$B/sp-compile" models/tiny/gpt-tiny.onnx --attention unfused --dtype $P -o "$ROOT/tiny-$P.plan" --quiet
    for D in cpu cuda "cuda --cuda-epilogues"; do
      "$B/sp-run" "$ROOT/tiny-$P.plan" --data "$ROOT/data.bin" --steps 20 --device $D 2>&1 | tee -a "$OUT/sp-run.log" | grep -E "^(trained|memory|time per step)"
    done
  done
  if (( $(nvidia-smi -L | grep -c '^GPU') >= 2 )); then
    for L in "--tp 2 --sp" "--pp 2 --microbatches 4" "--pp 2 --schedule zb1p --microbatches 4"; do
      say "sp-run: the default model at $L on 2 GPUs (thread ranks: NCCL groups, pipeline channels) and on the CPU"
      "$B/sp-compile" models/tiny/gpt-tiny.onnx --attention unfused $L -o "$ROOT/tiny-grid.plan" --quiet
      for D in cpu cuda "cuda --cuda-epilogues"; do
        "$B/sp-run" "$ROOT/tiny-grid.plan" --data "$ROOT/data.bin" --steps 20 --device $D 2>&1 | tee -a "$OUT/sp-run.log" | grep -E "^(trained|memory|time per step)"
      done
    done
  fi
  for P in fp32 bf16; do
    say "sp-run: the default model with sp-compile's default, fused attention core, $P: CPU, GPU (blockwise), GPU (unfused ops)"
    "$B/sp-compile" models/tiny/gpt-tiny.onnx --dtype $P -o "$ROOT/tiny-fused-$P.plan" --quiet
    for D in cpu cuda "cuda --cuda-attention unfused"; do
      "$B/sp-run" "$ROOT/tiny-fused-$P.plan" --data "$ROOT/data.bin" --steps 20 --device $D 2>&1 | tee -a "$OUT/sp-run.log" | grep -E "^(trained|memory|time per step)"
    done
  done
fi
if [[ $WHAT == bench || $WHAT == all ]]; then
  for M in ${BENCH_MODELS:-22B}; do
    say "bench_gpu.py --model $M"
    PYTHONUNBUFFERED=1 python3 tools/bench_gpu.py --device cuda --model "$M" ${BENCH_ARGS:---steps 8 --repeat 1 --dtype bf16} \
      --sp-bin "$B" --json "$OUT/bench-$M.json" 2>&1 | tee "$OUT/bench-$M.log" | tail -60
  done
fi
say "done; logs in $OUT"
