#!/usr/bin/env bash
# kernel-check.sh: the CUDA kernels through nvcc on a machine without a GPU
# (the dev machine has CUDA's compiler): registers, spills, stack and
# shared memory per kernel (ptxas -v), and optionally each file's PTX, so
# that a change can be checked before a device call and a pure refactor
# shown to compile to the same PTX as before.
#
# Usage (from the repo root):
#   bash tools/cuda/kernel-check.sh [--ptx DIR] [--arch sm_90a] [FILE.cu ...]
# FILE.cu: names under src/backend/cuda/kernels (default: all). --ptx DIR
# also writes DIR/FILE.cu.ptx; compare two trees' DIRs with `diff -r`.
#
# The kernels are compiled as NVRTC compiles them at run time
# (src/backend/cuda/cuda_compile.c): the same -D layout constants, with
# values read from the C headers, and every function a device function
# (NVRTC's -default-device; nvcc needs __device__ written, so a copy of
# the sources gets it). KERNEL_CHECK_DEFS: more -D options (e.g.
# "-DDFLASH_STAMPS", the backend's measurement build).
set -euo pipefail
cd "$(dirname "$0")/../.."
ptx_dir="" arch=sm_90a files=()
while [ $# -gt 0 ]; do
    case "$1" in
    --ptx) ptx_dir=$(mkdir -p "$2" && cd "$2" && pwd); shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *.cu) files+=("$1"); shift ;;
    *) echo "kernel-check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
command -v nvcc >/dev/null || PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { echo "kernel-check.sh: nvcc not found (looked on PATH and in /usr/local/cuda/bin)" >&2; exit 1; }

src=src/backend/cuda/kernels
[ ${#files[@]} -eq 0 ] && files=($(cd "$src" && ls *.cu))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The -D options cuda_compile.c passes, each value as the headers define it.
defs=()
for name in $(grep -o '"-D[A-Z0-9_]*=" STR([A-Z0-9_]*)' src/backend/cuda/cuda_compile.c | sed 's/.*STR(\(.*\))/\1/'); do
    value=$(printf '#include "backend/backend.h"\n#define STR_(x) #x\n#define STR(x) STR_(x)\nkernel_check_value STR(%s)\n' \
        "$name" | gcc -std=c11 -Iinclude -Isrc -E -P - | sed -n 's/^kernel_check_value "\(.*\)"$/\1/p')
    [ -n "$value" ] || { echo "kernel-check.sh: no value for $name from the headers" >&2; exit 1; }
    defs+=("-D$name=$value")
done
defs+=(${KERNEL_CHECK_DEFS:-})

cp "$src"/*.cu "$src"/*.cuh "$tmp"/
# __forceinline__ functions (at the start of a line, or after a template
# header) become __device__ ones
perl -0pi -e 's/(template <[^>\n]*>\n)__forceinline__/$1__device__ __forceinline__/g;
              s/^__forceinline__/__device__ __forceinline__/mg;
              s/(template <[^>\n]*>) __forceinline__/$1 __device__ __forceinline__/g' "$tmp"/*.cu "$tmp"/*.cuh

echo "nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), $arch, ${defs[*]}"
fail=0
for f in "${files[@]}"; do
    f=$(basename "$f")
    [ -f "$tmp/$f" ] || { echo "kernel-check.sh: no $src/$f" >&2; exit 2; }
    echo "== $f"
    if (cd "$tmp" && nvcc -cubin -arch="$arch" -std=c++17 -Xptxas -v "${defs[@]}" "$f" -o "$f.cubin") >"$tmp/log" 2>&1; then
        sed -n "s/^ptxas info *: Compiling entry function '\(.*\)' for.*/\1/p;
                s/^ *\([0-9]* bytes stack frame.*\)/    \1/p;
                s/^ptxas info *: Used \(.*\)/    \1/p" "$tmp/log"
    else
        cat "$tmp/log"
        fail=1
    fi
    if [ -n "$ptx_dir" ]; then
        (cd "$tmp" && nvcc -ptx -arch="$arch" -std=c++17 "${defs[@]}" "$f" -o "$ptx_dir/$f.ptx") || fail=1
    fi
done
exit $fail
