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
#  5. model checks (issue 7): builds tools/cuda/cuda_model_check.c with the
#     whole library (every src/**/*.c but src/cli), which needs jansson,
#     pcre2-8 and utf8proc. When they do not link from the system, the .debs
#     that tools/gpu/fetch-debs.sh put in .debs/ (carried to the GPU machine:
#     carry [".debs"]) are unpacked with `dpkg -x` into $B/sysroot (never
#     into /) and the build points -I, -L and -Wl,-rpath there. Then runs it:
#     Qwen3 and DFlash fixtures on the GPU vs the CPU and the references,
#     greedy and speculative outputs, the embedded pair (spec == plain, tau,
#     tok/s). Runs before the sanitizers, which are the slow, open-ended part;
#  6. prints the op tables, the model check's FAIL and info rows, then a
#     summary table last (with each step's seconds). Exit status non-zero if anything failed.
# Knobs, for checking this script on a machine without a GPU (defaults run
# everything): GPU_TEST_ONLY=model runs only stage 5; GPU_TEST_SYSROOT=force
# uses the .debs sysroot even when the system has the libraries;
# MODEL_CHECK_ARGS are passed to cuda_model_check (e.g. --cpu-as-gpu);
# GPU_TEST_BUILD: the build folder (default build-gpu-test).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dflash-gpu-test}
mkdir -p "$OUT"
B=${GPU_TEST_BUILD:-build-gpu-test}
mkdir -p "$B"
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
names=() rcs=() secs=()
step() { # name, log file, command...
    local name=$1 log=$2; shift 2
    echo "=== $name: $*"
    local t0=$SECONDS
    "$@" 2>&1 | tee "$OUT/$log"
    local rc=${PIPESTATUS[0]}
    names+=("$name"); rcs+=("$rc"); secs+=("$((SECONDS - t0))")
    echo "=== $name: rc=$rc"
}
ONLY=${GPU_TEST_ONLY:-all}

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
if [ "$ONLY" != model ]; then
step build-nvrtc-test build.txt build "$B/test_cuda_nvrtc" tests/test_cuda_nvrtc.c
step build-ops-check build2.txt build "$B/cuda_ops_check" tools/cuda/cuda_ops_check.c
step nvrtc-test nvrtc_test.txt "$B/test_cuda_nvrtc"
step ops-check ops_check.txt "$B/cuda_ops_check"
fi

# ---- 5. model checks ----
LIBS="-ljansson -lpcre2-8 -lutf8proc"
SR=$B/sysroot
system_libs_ok() { # the three headers compile and the libraries link
    printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <jansson.h>\n#include <pcre2.h>\n#include <utf8proc.h>\nint main(void){json_decref(json_object());return utf8proc_version()==0;}\n' >"$B/libs.c"
    gcc "$B/libs.c" -o "$B/libs" $LIBS 2>/dev/null
}
make_sysroot() { # unpack every .deb of .debs/ into $SR
    rm -rf "$SR" && mkdir -p "$SR" || return 1
    ls .debs/*.deb >/dev/null 2>&1 || {
        echo "no .debs/*.deb: run 'bash tools/gpu/fetch-debs.sh' on the dev machine and carry [\".debs\"]"
        return 1
    }
    local d t
    for d in .debs/*.deb; do
        echo "unpack $d"
        if command -v dpkg >/dev/null; then
            dpkg -x "$d" "$SR" || return 1
        else # ar + tar, as dpkg -x does
            t=$(mktemp -d) && (cd "$t" && ar x "$OLDPWD/$d") && tar -xf "$t"/data.tar.* -C "$SR" || return 1
            rm -rf "$t"
        fi
    done
    echo "arch: machine $(uname -m), debs $(dpkg-deb -f "$(ls .debs/*.deb | head -n 1)" Architecture 2>/dev/null || echo '?')"
    ls "$SR/usr/include/jansson.h" "$SR/usr/include/pcre2.h" "$SR/usr/include/utf8proc.h" &&
        find "$SR" -name 'libjansson.so' -o -name 'libpcre2-8.so' -o -name 'libutf8proc.so'
}
MFLAGS=""
if [ "${GPU_TEST_SYSROOT:-}" != force ] && system_libs_ok; then
    echo "model check: jansson/pcre2/utf8proc from the system"
    model_ready=1
else
    echo "model check: jansson/pcre2/utf8proc not usable from the system (or GPU_TEST_SYSROOT=force): sysroot $SR from .debs/"
    step sysroot sysroot.txt make_sysroot
    model_ready=$(( ${rcs[${#rcs[@]}-1]} == 0 ))
    LIBDIR=$(dirname "$(find "$SR" -name 'libjansson.so' 2>/dev/null | head -n 1)")
    LIBDIR=$(cd "$LIBDIR" 2>/dev/null && pwd)
    MFLAGS="-I$SR/usr/include -L$LIBDIR -Wl,-rpath,$LIBDIR"
fi
if [ "$model_ready" = 1 ]; then
    MSRC=$(find src -name '*.c' ! -path 'src/cli/*' | sort)
    build_model() {
        gcc $CFLAGS $OMP $MFLAGS -o "$B/cuda_model_check" tools/cuda/cuda_model_check.c $MSRC $LIBS -ldl -lm &&
            { ldd "$B/cuda_model_check" | grep -E 'jansson|pcre2|utf8proc' || true; }
    }
    step build-model-check build3.txt build_model
    if [ "${rcs[${#rcs[@]}-1]}" = 0 ]; then
        step model-check model_check.txt "$B/cuda_model_check" ${MODEL_CHECK_ARGS:-}
    else
        names+=("model-check"); rcs+=("not-built"); secs+=(0)
    fi
else
    names+=("model-check"); rcs+=("no-libs"); secs+=(0)
fi

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/compute-sanitizer/compute-sanitizer /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
if [ "$ONLY" = model ]; then
    :
elif [ -n "$SAN" ]; then
    # The small run only: sanitizers slow kernels 10-100x. Kernels come from
    # the disk cache the full run filled.
    step memcheck memcheck.txt "$SAN" --tool memcheck --leak-check full --error-exitcode 3 "$B/cuda_ops_check" --small
    step racecheck racecheck.txt "$SAN" --tool racecheck --error-exitcode 3 "$B/cuda_ops_check" --small
    step synccheck synccheck.txt "$SAN" --tool synccheck --error-exitcode 3 "$B/cuda_ops_check" --small
else
    echo "compute-sanitizer: NOT FOUND (looked on PATH and under /usr/local/cuda); sanitizer steps not run"
    names+=("sanitizers"); rcs+=("not-found"); secs+=(0)
fi

# Tables last: timings and parity from the full check, the model check's
# table, then the steps.
echo
if [ -f "$OUT/ops_check.txt" ]; then
    sed -n '/^op  *shape (timed)/,/^$/p' "$OUT/ops_check.txt"
    grep -E '^(op  *shape  *max err|.* FAIL$)' "$OUT/ops_check.txt" | head -n 40
    grep '^RESULT' "$OUT/ops_check.txt" || true
    echo
fi
if [ -f "$OUT/model_check.txt" ]; then
    # The full table is in model_check.txt: here its FAIL and info rows.
    grep -E '^(  (plain|spec|speedup)|cuda_model_check:)' "$OUT/model_check.txt"
    grep -E '^check  *value  *bound  *result$| FAIL$|info\)|^RESULT' "$OUT/model_check.txt"
    echo
fi
printf '%-18s %-6s %s\n' step secs result
fail=0
for i in "${!names[@]}"; do
    r=${rcs[$i]}
    if [ "$r" = 0 ]; then s=ok; else s="FAIL (rc=$r)"; fail=1; fi
    printf '%-18s %-6s %s\n' "${names[$i]}" "${secs[$i]}" "$s"
done
exit $fail
