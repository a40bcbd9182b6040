#!/usr/bin/env bash
# The tolerance matrix: the numerical unit tests under the OpenBLAS kernel
# sets this CPU can run (OPENBLAS_CORETYPE) and with 1, 2 and 4 kernel
# threads (SP_TEST_THREADS), so that no bound holds only on the machine it
# was written on. OpenBLAS picks its GEMM kernels by CPU, and they round
# differently; the bounds are derived from each run's own float32 rounding
# (tests/unit/TrainHarness.h), and this script shows they hold for all of
# them.
#
#   tests/tolerance_matrix.sh BUILD_DIR          the numerical unit tests,
#                                                every cell
#   tests/tolerance_matrix.sh BUILD_DIR --full   also the whole ctest suite
#                                                once per kernel set
#
# The kernel sets, one per instruction family: Prescott (SSE3), Nehalem,
# Sandybridge (AVX), Haswell (AVX2 + FMA) and SkylakeX (AVX-512), those this
# CPU executes. Zen and Cooperlake are left out by default: they run the
# Haswell and SkylakeX single-precision kernels again (Cooperlake adds a
# bf16 GEMM sp does not call), and the largest ratios measured under them
# equalled those kernel sets' on one AVX-512 machine (docs/testing.md; a
# maximum, not every value); "native" is whichever of these
# OpenBLAS picks by itself, and what ctest runs.
# The numerical tests (NUMERICAL below) are every unit test whose result
# goes through a float kernel: the layouts against one device, the kernels
# against float64 and torch, recomputation, pipelines, mixed precision; the
# IR, import, scheduling, report and I/O tests compute nothing a kernel set
# changes, and run once in ctest.
#
# Environment: SP_MATRIX_CORETYPES and SP_MATRIX_THREADS replace the lists
# ("native" is a kernel set too), SP_MATRIX_FILTER replaces the
# --gtest_filter (* for every unit test), SP_MATRIX_CELL_TIMEOUT bounds a
# cell's seconds (default 900).
# Prints one line per cell with the largest measured ratio of a difference
# to its bound's scale (float32 and float64; the bound is 8), and exits 1
# if any cell failed.
set -u

if [ $# -lt 1 ] || [ $# -gt 2 ] || { [ $# -eq 2 ] && [ "$2" != --full ]; }; then
  echo "usage: $0 BUILD_DIR [--full]" >&2
  exit 2
fi
BUILD=$(cd "$1" 2>/dev/null && pwd) || { echo "$0: no build directory $1" >&2; exit 2; }
FULL=${2:-}
TESTS=$BUILD/bin/sp-unit-tests
if [ ! -x "$TESTS" ]; then
  echo "$0: $TESTS is missing: build first" >&2
  exit 2
fi

# The kernel sets of Debian's OpenBLAS (DYNAMIC_ARCH) this CPU can execute:
# forcing one whose instructions the CPU lacks would die of SIGILL.
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }
default_coretypes() {
  local c="Prescott Nehalem"
  has avx && c+=" Sandybridge"
  has avx2 && has fma && c+=" Haswell"
  has avx512f && has avx512bw && has avx512vl && c+=" SkylakeX"
  echo "$c"
}
CORETYPES=${SP_MATRIX_CORETYPES:-$(default_coretypes)}
# The environment of a kernel set; native: the kernels OpenBLAS picks for
# this CPU by itself.
coretype() {
  if [ "$1" = native ]; then echo "-u OPENBLAS_CORETYPE"; else echo "OPENBLAS_CORETYPE=$1"; fi
}
THREADS=${SP_MATRIX_THREADS:-1 2 4}
NUMERICAL="FusedAttention.*:AutoPlan*:Bf16Gemm.*:CausalProducts.*:CostModel.*"
NUMERICAL+=":CpuBackend.*:Executor.*:MemoryPlan.*:FuseEpilogue.*:FuseSoftmax.*"
NUMERICAL+=":Cpu*Test.*:MixedPrecision.*:Overlap.*:*ParallelEqualsOneDevice*"
NUMERICAL+=":ParallelVocabulary.*:ToleranceRule.*:Pipeline.*:*PipelineEqualsOneDevice*"
NUMERICAL+=":Recompute.*:*RecomputeEqualsNone*:Sample.*"
FILTER=${SP_MATRIX_FILTER:-$NUMERICAL}
CELL_TIMEOUT=${SP_MATRIX_CELL_TIMEOUT:-900}

failed=0
cells=0
worst32=0
worst64=0
log=$(mktemp -d "${TMPDIR:-/tmp}/sp-tolerance.XXXXXX")
trap 'rm -rf "$log"' EXIT
printf '%-12s %-8s %-6s %-10s %-10s %s\n' coretype threads result "max f32" "max f64" "(ratio to the rounding scale; bound 8)"
for C in $CORETYPES; do
  for T in $THREADS; do
    cells=$((cells + 1))
    out=$log/$C-$T.txt
    # shellcheck disable=SC2046
    # A cell takes 2-5 minutes here; one that runs past CELL_TIMEOUT is
    # stuck, and fails naming the test it was in.
    env $(coretype "$C") SP_TEST_THREADS=$T SP_TOLERANCE_REPORT=1 \
      timeout -k 10 "$CELL_TIMEOUT" "$TESTS" --gtest_filter="$FILTER" >"$out" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
      result=ok
    else
      result=FAILED
      failed=$((failed + 1))
    fi
    # (ToleranceRule's runs are perturbed on purpose.)
    read -r m32 m64 < <(awk '/^tolerance / && !/ToleranceRule/ { if ($(NF-2) > a) a = $(NF-2); if ($NF > b) b = $NF }
                         END { printf "%g %g\n", a + 0, b + 0 }' "$out")
    worst32=$(awk -v a="$worst32" -v b="$m32" 'BEGIN { print (b > a ? b : a) }')
    worst64=$(awk -v a="$worst64" -v b="$m64" 'BEGIN { print (b > a ? b : a) }')
    printf '%-12s %-8s %-6s %-10s %-10s\n' "$C" "$T" "$result" "$m32" "$m64"
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      echo "    timed out after ${CELL_TIMEOUT}s in: $(grep '^\[ RUN' "$out" | tail -1)"
    fi
    if [ "$result" = FAILED ]; then
      grep -E "^\[  FAILED|Failure|differ" "$out" | sort -u | head -20 | sed 's/^/    /'
    fi
  done
  if [ "$FULL" = --full ]; then
    cells=$((cells + 1))
    out=$log/$C-ctest.txt
    # shellcheck disable=SC2046
    if (cd "$BUILD" && env $(coretype "$C") ctest --output-on-failure >"$out" 2>&1); then
      printf '%-12s %-8s %-6s %s\n' "$C" ctest ok "$(grep -E 'tests passed' "$out")"
    else
      failed=$((failed + 1))
      printf '%-12s %-8s %-6s\n' "$C" ctest FAILED
      grep -E "\(Failed\)|\*\*\*Failed" "$out" | head -20 | sed 's/^/    /'
    fi
  fi
done
echo "tolerance matrix: $cells cells, $failed failed; largest ratio float32 $worst32, float64 $worst64 (bound 8)"
[ "$failed" -eq 0 ]
