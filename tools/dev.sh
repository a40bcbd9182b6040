#!/usr/bin/env bash
# The commands of the README (README.md, "The two commands"), for a fresh
# Debian 12 machine:
#
#   tools/dev.sh run    install what is missing, build, and run the main job:
#                       compile the committed default model, train it on the
#                       CPU on a bundled text, and show the loss falling
#   tools/dev.sh test   install what is missing, build, and run ctest: the
#                       unit, lit, end-to-end, MPI and emulated-GPU tests but
#                       the slowest (SP_QUICK=1, ctest -LE slow)
#   tools/dev.sh check  every test, then the reliability runs (the tolerance
#                       matrix, 30 s of each fuzzer, the unit tests under
#                       ASan + UBSan and the multi-rank ones under TSan);
#                       what CI runs (.ci/run)
#
# Builds go through ccache (installed with the rest), so a second build of
# the same sources, in this tree or a fresh clone, compiles only what
# changed. They are unity builds (CMake's CMAKE_UNITY_BUILD: each target's
# sources compiled eight to a translation unit), which halves a cold build;
# UNITY=OFF builds file by file, quicker to rebuild after editing one file.
#
# Environment: BUILD_DIR (default build), JOBS (default: number of cores),
# UNITY (default ON), STEPS (training steps of the main job, default 1500),
# FUZZ_SECONDS (per fuzzer, default 30).
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

# Debian packages the build and the tests need.
PACKAGES=(
  cmake ninja-build g++ pkg-config ccache
  llvm-14-dev llvm-14-tools             # ADT/Support, cl::opt, FileCheck, lit
  libonnx-dev libprotobuf-dev protobuf-compiler
  nlohmann-json3-dev googletest libgtest-dev
  libpcre2-dev                          # Unicode regexes of the tokenizer (text/)
  libopenblas-dev                       # GEMMs of the CPU backend
  libopenmpi-dev openmpi-bin            # MPI communicator and tests/mpi (mpirun)
  python3-torch python3-onnx python3-numpy  # reference exports (/usr/bin/python3)
  clang-14 libclang-rt-14-dev           # libFuzzer and sanitizers (tests/fuzz)
  chromium                              # headless: renders the --html pages (e2e-html-report)
)

install_missing() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "== installing: ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Minutes since the start, after each stage (CI stops a run at 90).
elapsed() { echo "== $((SECONDS / 60)) min $((SECONDS % 60)) s so far"; }

build() {
  echo "== configuring and building in $BUILD_DIR"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_UNITY_BUILD="${UNITY:-ON}" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache >/dev/null
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

case "${1:-}" in
  run)
    install_missing
    build
    bin="$BUILD_DIR/bin"
    echo "== sp-compile models/tiny/gpt-tiny.onnx -o $BUILD_DIR/gpt-tiny.plan"
    "$bin/sp-compile" models/tiny/gpt-tiny.onnx -o "$BUILD_DIR/gpt-tiny.plan" \
      --report "$BUILD_DIR/gpt-tiny.report.json"
    echo "== sp-tokenize models/data/python-reference.txt --split 0.9 (training and held-out validation tokens)"
    "$bin/sp-tokenize" models/data/python-reference.txt -o "$BUILD_DIR/python-reference.bin" --split 0.9
    echo "== sp-run: train ${STEPS:=1500} steps on the CPU, validating every $((STEPS / 10))"
    rm -rf "$BUILD_DIR/gpt-tiny.ckpt"
    "$bin/sp-run" "$BUILD_DIR/gpt-tiny.plan" --data "$BUILD_DIR/python-reference.bin" \
      --val-data "$BUILD_DIR/python-reference.val.bin" --eval-every $((STEPS / 10)) \
      --steps "$STEPS" --lr 3e-3 --warmup 20 --log-every $((STEPS / 10)) \
      --checkpoint-every "$STEPS" --checkpoint "$BUILD_DIR/gpt-tiny.ckpt"
    echo "== the loss, every $((STEPS / 10)) steps ($BUILD_DIR/gpt-tiny.plan/run/loss.csv, loss.svg)"
    awk -F, -v every=$((STEPS / 10)) 'NR > 1 && ($1 == 1 || $1 % every == 0) { printf "  step %4d  training loss %.4f  validation loss %s\n", $1, $2, ($5 == "" ? "-" : sprintf("%.4f", $5)) }' \
      "$BUILD_DIR/gpt-tiny.plan/run/loss.csv"
    echo "== sp-run --sample: what the trained model writes after 'def '"
    "$bin/sp-run" "$BUILD_DIR/gpt-tiny.plan" --checkpoint "$BUILD_DIR/gpt-tiny.ckpt" \
      --sample "def " --tokens 200
    echo
    ;;
  test | check)
    install_missing
    build
    elapsed
    # (No test takes two minutes here; one past 10 is stuck.)
    if [ "$1" = test ]; then
      # The quick tier: all but the slowest tests (label slow, and those
      # that skip themselves under SP_QUICK=1; tests/CMakeLists.txt).
      echo "== running the tests (all but the slow ones, which check runs)"
      (cd "$BUILD_DIR" && SP_QUICK=1 ctest --output-on-failure --timeout 600 -j "$JOBS" -LE slow)
    else
      echo "== running every test"
      (cd "$BUILD_DIR" && ctest --output-on-failure --timeout 600 -j "$JOBS")
    fi
    elapsed
    [ "$1" = test ] && exit 0
    # The same bounds under other OpenBLAS kernels: every kernel set this CPU
    # runs at 2 threads, and this CPU's own at 1 and 4.
    echo "== tolerance matrix (tests/tolerance_matrix.sh)"
    SP_MATRIX_THREADS=2 tests/tolerance_matrix.sh "$BUILD_DIR"
    SP_MATRIX_CORETYPES=native SP_MATRIX_THREADS="1 4" tests/tolerance_matrix.sh "$BUILD_DIR"
    elapsed
    # Fuzzing first: the ASan + UBSan unit tests then build in its tree.
    echo "== fuzzing (tests/fuzz/run_fuzz.sh ${FUZZ_SECONDS:=30})"
    FUZZ_ARGS="-seed=1" tests/fuzz/run_fuzz.sh "$FUZZ_SECONDS"
    elapsed
    echo "== sanitizers (tests/sanitize.sh)"
    tests/sanitize.sh address
    elapsed
    tests/sanitize.sh thread
    elapsed
    ;;
  *)
    echo "usage: tools/dev.sh run|test|check" >&2
    exit 2
    ;;
esac
