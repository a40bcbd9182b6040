#!/bin/sh
# Exports the model families users bring (models/export_family.py: HF-style
# GPT-2, Llama with grouped-query heads and a padding mask, a BERT encoder)
# and trains each one's fused plan as the CUDA backend runs it, attention
# expanded into unfused ops, against the CPU backend
# (ExpandedPlanTest.cpp, ExpandedPlan.ExportedFamiliesTrainAsTheCpu); given
# EMULATED_TESTS (sp-cuda-emulated-tests), also with attention run by the
# blockwise kernels' source on the CUDA emulator
# (EmulatedKernelTest.cpp, EmulatedPlan.ExportedFamiliesTrainAsTheCpu).
#
#   check_expanded_plans.sh PYTHON SOURCE_DIR HOST_TESTS WORK_DIR [EMULATED_TESTS]
set -eu
PY=$1 SRC=$2 TESTS=$3 WORK=$4 EMULATED=${5:-}
rm -rf "$WORK"
mkdir -p "$WORK"
MODELS=$("$(dirname "$0")/export_families.sh" "$PY" "$SRC" "$WORK")
# run BINARY TEST: the test on the three models; a skipped test would pass
# too, so make sure it ran.
run() {
  SP_EXPANSION_MODELS="$MODELS" "$1" --gtest_filter="$2" \
    > "$WORK/out.txt" 2>&1 || { cat "$WORK/out.txt"; exit 1; }
  cat "$WORK/out.txt"
  grep -q "^\[       OK \] $2" "$WORK/out.txt"
}
run "$TESTS" ExpandedPlan.ExportedFamiliesTrainAsTheCpu
if [ -n "$EMULATED" ]; then
  run "$EMULATED" EmulatedPlan.ExportedFamiliesTrainAsTheCpu
fi
