#!/usr/bin/env bash
# gpu-test.sh: the CUDA backend's checks on a GPU machine, one command from
# the repo root: `bash tools/gpu-test.sh` (env OUT: a folder for the logs).
#  1. builds, with gcc directly (not the Makefile: the GPU image may lack the
#     jansson/pcre2/utf8proc headers the full build needs), two programs from
#     only src/core, src/backend, src/backend/cpu and src/backend/cuda:
#     tests/test_cuda_nvrtc.c and tools/cuda/cuda_ops_check.c;
#  2. runs test_cuda_nvrtc (NVRTC compile of every kernel, embedded sources
#     up to date, cache, backend creation on this GPU);
#  3. runs cuda_ops_check: every op against the CPU reference at real shapes,
#     then op timings (us, GB/s);
#  4. runs cuda_ops_check --small under compute-sanitizer memcheck (with
#     leak check) and racecheck;
#  5. prints a summary table last. Exit status non-zero if anything failed.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dflash-gpu-test}
mkdir -p "$OUT"
B=build-gpu-test
mkdir -p "$B"
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
names=() rcs=()
step() { # name, log file, command...
    local name=$1 log=$2; shift 2
    echo "=== $name: $*"
    "$@" 2>&1 | tee "$OUT/$log"
    local rc=${PIPESTATUS[0]}
    names+=("$name"); rcs+=("$rc")
    echo "=== $name: rc=$rc"
}

SRC="$(ls src/core/*.c) src/backend/backend.c $(ls src/backend/cpu/*.c) $(ls src/backend/cuda/*.c)"
CFLAGS="-std=c11 -O2 -g -Wall -Wextra -Werror -Iinclude -Isrc -Itests -D_GNU_SOURCE"
OMP=-fopenmp
echo 'int main(void){return 0;}' >"$B/omp.c"
gcc -fopenmp "$B/omp.c" -o "$B/omp" 2>/dev/null || OMP=-Wno-unknown-pragmas
build() { # output, main source
    gcc $CFLAGS $OMP -o "$1" "$2" $SRC -ldl -lm
}
{
    echo "gcc: $(gcc --version | head -n 1)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
} | tee "$OUT/env.txt"
step build-nvrtc-test build.txt build "$B/test_cuda_nvrtc" tests/test_cuda_nvrtc.c
step build-ops-check build2.txt build "$B/cuda_ops_check" tools/cuda/cuda_ops_check.c
step nvrtc-test nvrtc_test.txt "$B/test_cuda_nvrtc"
step ops-check ops_check.txt "$B/cuda_ops_check"

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/compute-sanitizer/compute-sanitizer /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
if [ -n "$SAN" ]; then
    # The small run only: sanitizers slow kernels 10-100x. Kernels come from
    # the disk cache the full run filled.
    step memcheck memcheck.txt "$SAN" --tool memcheck --leak-check full --error-exitcode 3 "$B/cuda_ops_check" --small
    step racecheck racecheck.txt "$SAN" --tool racecheck --error-exitcode 3 "$B/cuda_ops_check" --small
    step synccheck synccheck.txt "$SAN" --tool synccheck --error-exitcode 3 "$B/cuda_ops_check" --small
else
    echo "compute-sanitizer: NOT FOUND (looked on PATH and under /usr/local/cuda); sanitizer steps not run"
    names+=("sanitizers"); rcs+=("not-found")
fi

# Tables last: timings and parity from the full check, then the steps.
echo
sed -n '/^op  *shape (timed)/,/^$/p' "$OUT/ops_check.txt"
grep -E '^(op  *shape  *max err|.* FAIL$)' "$OUT/ops_check.txt" | head -n 40
grep '^RESULT' "$OUT/ops_check.txt" || true
echo
printf '%-18s %s\n' step result
fail=0
for i in "${!names[@]}"; do
    r=${rcs[$i]}
    if [ "$r" = 0 ]; then s=ok; else s="FAIL (rc=$r)"; fail=1; fi
    printf '%-18s %s\n' "${names[$i]}" "$s"
done
exit $fail
