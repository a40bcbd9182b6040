#!/bin/bash
# sp-run --device cuda on emulated GPUs (label emulated): sp-run-emulated is
# sp-run linked against the emulated CUDA runtime, NCCL and cuBLAS
# (EmulatedRuntime.h) instead of the real ones. The default model trained on
# the tool's path, thread ranks each on an emulated GPU, against sp-run
# --device cpu on the same plan and data: one device with the paper's
# attention ops; t = 2 + SP with the fused core by the blockwise kernels, and
# with the linear biases in cuBLASLt's epilogue (--cuda-epilogues); and
# the 2 x 2 x 2 grid (t = 2 + SP, p = 2, d = 2 with ZeRO-1); context
# parallelism (cp 2 x t 2 + SP, the ring; cp 4, all-to-all in pairs + ring).
# The numerics are
# checked by sp-gpu-emulated-tests; this checks the tool's path.
#
# With MPIEXEC, the launch a cluster uses: one process per rank (mpirun,
# --comm mpi), each with emulated GPUs of its own and the NCCL
# communicators bootstrapped over MPI (the unique id broadcast by each
# group's rank 0), their operations MPI messages between the processes
# (EmulatedRuntime.h): the 2 x 2 x 2 grid with ZeRO-1, t = 2 + SP with the
# ring all-gathers at d = 2, ZB-H1 at p = 2, and cp 2 by all-to-all x d 2
# with ZeRO-1, against the CPU.
# And a launch with more ranks per node than GPUs: one error, no hang.
#   check_sp_run_emulated.sh BIN_DIR SP_RUN_EMULATED SOURCE_DIR WORK_DIR [MPIEXEC]
set -euo pipefail
BIN=$1 EMU=$2 SRC=$3 WORK=$4 MPIEXEC=${5:-}
rm -rf "$WORK" && mkdir -p "$WORK"
"$BIN/sp-tokenize" "$SRC/models/data/python-reference.txt" -o "$WORK/data.bin" > /dev/null
# check NAME STEPS RUN_FLAGS -- COMPILE_FLAGS...
# (LAUNCH, when set: the launcher and its flags, for one process per rank.)
LAUNCH=
check() {
  local Name=$1 Steps=$2 RunFlags=$3
  shift 3
  "$BIN/sp-compile" "$SRC/models/tiny/gpt-tiny.onnx" "$@" -o "$WORK/$Name" --quiet
  local Out G C
  Out=$($LAUNCH "$EMU" "$WORK/$Name" --data "$WORK/data.bin" --steps "$Steps" --device cuda $RunFlags --log-dir "$WORK/log-$Name-cuda" 2>&1) ||
    { echo "$Out"; exit 1; }
  grep -q "the GPUs' dense GEMM peak" <<<"$Out" || { echo "$Out"; echo "not on the CUDA backend"; exit 1; }
  if [ -n "${EXPECT:-}" ] && ! grep -q "$EXPECT" <<<"$Out"; then
    echo "$Out"; echo "sp-run did not say: $EXPECT"; exit 1
  fi
  G=$(sed -n 's/.*final loss \([0-9.]*\),.*/\1/p' <<<"$Out")
  Out=$("$BIN/sp-run" "$WORK/$Name" --data "$WORK/data.bin" --steps "$Steps" --device cpu --log-dir "$WORK/log-$Name-cpu" 2>&1) ||
    { echo "$Out"; exit 1; }
  C=$(sed -n 's/.*final loss \([0-9.]*\),.*/\1/p' <<<"$Out")
  echo "$Name: final loss after $Steps steps: emulated cuda${LAUNCH:+ (one process per rank)} $G, cpu $C"
  # The same plan, data and dropout keys: the losses agree but for GEMM
  # rounding; 1e-3 relative is a sanity bound only.
  awk -v g="$G" -v c="$C" 'BEGIN { d = g - c; if (d < 0) d = -d; exit !(g != "" && d <= 1e-3 * c) }'
}
check one 20 "" --attention unfused
check tp2sp 10 "--cuda-attention blockwise" --tp 2 --sp
EXPECT="linear biases: in the GEMM's epilogue" check epilogues 10 "--cuda-epilogues" --tp 2 --sp --attention unfused
check grid 6 "" --tp 2 --sp --pp 2 --microbatches 2 --dp 2 --zero 1
check cp 6 "" --cp 2 --tp 2 --sp
check cp-a2a-ring 4 "" --cp 4 --cp-comm a2a+ring --cp-a2a 2

# More ranks than GPUs (2 emulated GPUs, 4 thread ranks): the ranks that have
# one must not wait in ncclCommInitRank for those that do not.
few() {
  local Out Status=0
  Out=$(SP_EMULATED_DEVICES=2 SP_EMULATED_TIMEOUT=60 timeout 120 "$@" 2>&1) || Status=$?
  if [ "$Status" != 1 ] || ! grep -q "has no GPU\|this machine shows 2 CUDA device" <<<"$Out"; then
    echo "$Out"; echo "4 ranks on 2 GPUs: exit $Status, expected 1 and the error"; exit 1
  fi
  echo "4 ranks on 2 GPUs: $(grep -m1 error <<<"$Out")"
}
"$BIN/sp-compile" "$SRC/models/tiny/gpt-tiny.onnx" --tp 2 --pp 2 --microbatches 2 -o "$WORK/four" --quiet
few "$EMU" "$WORK/four" --data "$WORK/data.bin" --steps 1 --device cuda

[ -n "$MPIEXEC" ] || exit 0
export OMPI_MCA_btl_vader_single_copy_mechanism=none
LAUNCH="$MPIEXEC --oversubscribe$( [ "$(id -u)" = 0 ] && echo " --allow-run-as-root") -np"
few $LAUNCH 4 "$EMU" "$WORK/four" --comm mpi --data "$WORK/data.bin" --steps 1 --device cuda
LAUNCH="$LAUNCH 8" check grid-mpi 6 "--comm mpi" --tp 2 --sp --pp 2 --microbatches 2 --dp 2 --zero 1
LAUNCH="$LAUNCH 4" check ring-mpi 6 "--comm mpi" --tp 2 --sp --tp-comm-overlap --dp 2
LAUNCH="$LAUNCH 2" check zb-mpi 6 "--comm mpi" --pp 2 --schedule zb1p --microbatches 4
LAUNCH="$LAUNCH 4" check cp-mpi 6 "--comm mpi" --cp 2 --cp-comm a2a --dp 2 --zero 1
