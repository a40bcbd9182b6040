#!/usr/bin/env bash
# The unit tests under sanitizers, in clang-14 builds configured by
# tests/configure_sanitized.sh and rebuilt incrementally:
#
#   tests/sanitize.sh address [FILTER]   ASan + UBSan (and LeakSanitizer):
#                                        every unit test; build-fuzz/, the
#                                        fuzzers' tree (its libFuzzer
#                                        coverage only slows the run)
#   tests/sanitize.sh thread [FILTER]    TSan: the threaded communicators and
#                                        the runtime's multi-rank tests,
#                                        the planner's concurrent search;
#                                        build-tsan/
#
# FILTER replaces the --gtest_filter. Any report fails the run: ASan and
# UBSan abort at the first, TSan exits 66 at the end. The libraries are
# instrumented and keep their assertions; Open MPI and OpenBLAS are not
# instrumented (OpenBLAS runs single-threaded under the CPU backend, whose
# own kernel threads are). The CUDA backend is left out (nvcc takes no
# -fsanitize; the plain build tests its host logic).
# Environment: BUILD_DIR (default build-fuzz or build-tsan), JOBS.
set -euo pipefail

cd "$(dirname "$0")/.."
MODE=${1:-}
case "$MODE" in
  address)
    SANITIZE=address,undefined
    FLAVOUR=fuzz
    DIR=build-fuzz
    FILTER=${2:-*}
    ;;
  thread)
    SANITIZE=thread
    FLAVOUR=thread
    DIR=build-tsan
    # The thread communicator, the executor and every test that trains on
    # thread ranks (tensor-parallel, pipelined, recomputed, context-parallel:
    # the ring and the all-to-all) and the tokenizer's threads.
    FILTER=${2:-CommTest.*:Comm/CommRanks.*:ProcessGrid.*:CpuParallelTest.*:Executor.*:*ParallelEqualsOneDevice.*:*PipelineEqualsOneDevice.*:Pipeline.*:*RecomputeEqualsNone.*:*AutoPlan*:ContextParallel.TinyGpt*:ContextAttention.ThreadCountChangesNoBit:Tokenizer.ThreadsGiveTheIdsOfOne}
    ;;
  *)
    echo "usage: tests/sanitize.sh address|thread [FILTER]" >&2
    exit 2
    ;;
esac
BUILD_DIR=${BUILD_DIR:-$DIR}
JOBS=${JOBS:-$(nproc)}

tests/configure_sanitized.sh "$FLAVOUR" "$BUILD_DIR"
echo "== building sp-unit-tests in $BUILD_DIR"
cmake --build "$BUILD_DIR" --target sp-unit-tests -j "$JOBS"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=0:exitcode=66:second_deadlock_stack=1}
echo "== sp-unit-tests under -fsanitize=$SANITIZE (filter $FILTER)"
# (Minutes here, built and run; a run past 40 is stuck.)
timeout -k 10 2400 "$BUILD_DIR/bin/sp-unit-tests" --gtest_brief=1 --gtest_filter="$FILTER"
echo "== no sanitizer report"
