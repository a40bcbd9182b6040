#!/usr/bin/env bash
# Runs an MPI test program (tests/mpi/comm_test.cpp) under mpirun with 1, 2
# and 4 processes, then once with --abort (which must end the job with an
# error) and once with --stall (a rank stops answering: the others must end
# the job after their 1 s timeout), and fails if any run fails or hangs.
#
#   tests/mpi/run_mpi_tests.sh BINARY [MPIEXEC]
#
# MPIEXEC defaults to mpirun. With Open MPI the runs oversubscribe (the tests
# use more processes than a small machine has cores) and, as root (CI), pass
# --allow-run-as-root. Environment: SP_MPI_SIZES (default "1 2 4"),
# SP_MPI_TIMEOUT seconds per run (default 120).
set -u

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 BINARY [MPIEXEC]" >&2
  exit 2
fi
BINARY=$1
MPIEXEC=${2:-mpirun}
SIZES=${SP_MPI_SIZES:-1 2 4}
TIMEOUT=${SP_MPI_TIMEOUT:-120}

if [ ! -x "$BINARY" ]; then
  echo "$0: $BINARY is not an executable" >&2
  exit 2
fi
if ! command -v "$MPIEXEC" >/dev/null 2>&1; then
  echo "$0: $MPIEXEC not found (Debian: apt-get install openmpi-bin)" >&2
  exit 2
fi

FLAGS=()
if "$MPIEXEC" --version 2>&1 | grep -q -E "Open MPI|OpenRTE|open-mpi"; then
  FLAGS+=(--oversubscribe)
  [ "$(id -u)" -eq 0 ] && FLAGS+=(--allow-run-as-root)
  # Containers often forbid the cross-process memory copies of the shared
  # memory transport; plain copies work everywhere.
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
fi

failed=()
for np in $SIZES; do
  echo "== $MPIEXEC -np $np $BINARY"
  timeout "$TIMEOUT" "$MPIEXEC" "${FLAGS[@]}" -np "$np" "$BINARY"
  rc=$?
  if [ $rc -eq 124 ]; then
    echo "-- $np processes: timed out after ${TIMEOUT}s" >&2
    failed+=("$np")
  elif [ $rc -ne 0 ]; then
    echo "-- $np processes: exit code $rc" >&2
    failed+=("$np")
  fi
done

# abort(): the last rank gives up while the others wait in a barrier; the job
# must end with an error, not hang and not succeed.
echo "== $MPIEXEC -np 2 $BINARY --abort (expected to fail)"
log=$(mktemp)
timeout "$TIMEOUT" "$MPIEXEC" "${FLAGS[@]}" -np 2 "$BINARY" --abort >"$log" 2>&1
rc=$?
if [ $rc -eq 124 ]; then
  echo "-- abort: timed out after ${TIMEOUT}s (a rank hung)" >&2
  failed+=("2 (abort)")
elif [ $rc -eq 0 ] || ! grep -q "aborting the job: requested by --abort" "$log"; then
  cat "$log" >&2
  echo "-- abort: exit code $rc, expected a failure naming the reason" >&2
  failed+=("2 (abort)")
else
  grep "aborting the job" "$log"
  echo "-- abort ended the job (exit code $rc)"
fi
rm -f "$log"

# A stalled rank: the last of 4 sleeps while the others all-reduce with a
# 1 s timeout; they must end the job within a few seconds, naming the call.
echo "== $MPIEXEC -np 4 $BINARY --stall (expected to fail after ~1 s)"
log=$(mktemp)
start=$(date +%s%N)
timeout "$TIMEOUT" "$MPIEXEC" "${FLAGS[@]}" -np 4 "$BINARY" --stall >"$log" 2>&1
rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
if [ $rc -eq 124 ]; then
  echo "-- stall: timed out after ${TIMEOUT}s (the others hung)" >&2
  failed+=("4 (stall)")
elif [ $rc -eq 0 ] || ! grep -q "timed out after 1.0 s in allReduceSum waiting for the other ranks (of 4)" "$log"; then
  cat "$log" >&2
  echo "-- stall: exit code $rc, expected a failure naming the call" >&2
  failed+=("4 (stall)")
elif [ "$elapsed_ms" -gt 30000 ]; then
  cat "$log" >&2
  echo "-- stall: the job took ${elapsed_ms} ms to end, expected ~1 s + start-up" >&2
  failed+=("4 (stall)")
else
  grep -m1 "timed out" "$log"
  echo "-- stall ended the job in ${elapsed_ms} ms (exit code $rc)"
fi
rm -f "$log"

if [ ${#failed[@]} -ne 0 ]; then
  echo "MPI tests failed with ${failed[*]} processes" >&2
  exit 1
fi
echo "MPI tests passed with $SIZES processes, abort and a stalled rank"
