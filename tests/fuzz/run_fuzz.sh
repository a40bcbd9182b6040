#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz and runs each for SECONDS.
#
#   tests/fuzz/run_fuzz.sh SECONDS [TARGET...]     (TARGET: onnx-import,
#       ir-parser, plan-reader, checkpoint-reader, token-loader; default all)
#
# The build is Debian's clang-14 with ASan, UBSan and assertions, in
# $BUILD_DIR (default build-fuzz, configured by tests/configure_sanitized.sh
# fuzz; tests/sanitize.sh address builds the unit tests in the same tree).
# The targets run one after another, each on a working corpus
# ($FUZZ_WORK/TARGET, default $BUILD_DIR/fuzz-work) seeded from the
# committed one (tests/fuzz/corpus/TARGET, which is only read), so every run
# replays the committed inputs, the regression inputs of fixed bugs among
# them. A crash, a leak, a sanitizer report, an input that runs longer than
# $FUZZ_TIMEOUT seconds (default 25) or needs more than 2 GB fails the run;
# the input that did it is kept as $FUZZ_WORK/artifacts/TARGET-* and the
# command to replay it is printed. At the end a table gives each target's
# executions.
#
# Needs the Debian packages clang-14 and libclang-rt-14-dev (libFuzzer and
# the sanitizer runtimes), besides what tools/dev.sh installs.
# Environment: BUILD_DIR, FUZZ_WORK, FUZZ_TIMEOUT, JOBS (build jobs, default
# the number of cores), FUZZ_ARGS (more libFuzzer flags).
set -euo pipefail

cd "$(dirname "$0")/../.."
if [ $# -lt 1 ] || ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
  echo "usage: tests/fuzz/run_fuzz.sh SECONDS [TARGET...]" >&2
  exit 2
fi
SECONDS_EACH=$1
shift
ALL=(onnx-import ir-parser plan-reader checkpoint-reader token-loader)
TARGETS=("${@:-${ALL[@]}}")
for T in "${TARGETS[@]}"; do
  [[ " ${ALL[*]} " == *" $T "* ]] || { echo "run_fuzz.sh: unknown target '$T' (${ALL[*]})" >&2; exit 2; }
done
BUILD_DIR=${BUILD_DIR:-build-fuzz}
FUZZ_WORK=${FUZZ_WORK:-$BUILD_DIR/fuzz-work}
FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-25}
JOBS=${JOBS:-$(nproc)}

tests/configure_sanitized.sh fuzz "$BUILD_DIR"
echo "== building the fuzz targets in $BUILD_DIR"
cmake --build "$BUILD_DIR" --target "${TARGETS[@]/#/sp-fuzz-}" -j "$JOBS"

mkdir -p "$FUZZ_WORK/artifacts" "$FUZZ_WORK/tmp"
# The ONNX target writes each input to a file under $TMPDIR.
export TMPDIR
TMPDIR=$(cd "$FUZZ_WORK/tmp" && pwd)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

FAILED=()
SUMMARY=()
for T in "${TARGETS[@]}"; do
  BIN="$BUILD_DIR/bin/sp-fuzz-$T"
  WORK="$FUZZ_WORK/$T"
  LOG="$FUZZ_WORK/$T.log"
  mkdir -p "$WORK"
  DICT=()
  [ -f "tests/fuzz/$T.dict" ] && DICT=(-dict="tests/fuzz/$T.dict")
  echo "== $T: ${SECONDS_EACH}s"
  set +e
  # shellcheck disable=SC2086
  "$BIN" "$WORK" "tests/fuzz/corpus/$T" "${DICT[@]}" \
    -max_total_time="$SECONDS_EACH" -timeout="$FUZZ_TIMEOUT" \
    -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$FUZZ_WORK/artifacts/$T-" ${FUZZ_ARGS:-} >"$LOG" 2>&1
  RC=$?
  set -e
  EXECS=$(sed -n 's/^stat::number_of_executed_units: *//p' "$LOG" | tail -1)
  RATE=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$LOG" | tail -1)
  SUMMARY+=("$(printf '%-18s %12s executions %8s/s' "$T" "${EXECS:-?}" "${RATE:-?}")")
  if [ $RC -ne 0 ]; then
    FAILED+=("$T")
    echo "!! $T failed (exit $RC); the end of $LOG:"
    grep -v '^#[0-9]' "$LOG" | tail -60
    ARTIFACT=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$LOG" | tail -1)
    [ -n "$ARTIFACT" ] && echo "!! replay: $BIN $ARTIFACT"
  fi
done

echo "== executions in ${SECONDS_EACH}s per target"
printf '%s\n' "${SUMMARY[@]}"
if [ ${#FAILED[@]} -ne 0 ]; then
  echo "== FAILED: ${FAILED[*]}"
  exit 1
fi
echo "== no crash, leak, sanitizer report or timeout"
