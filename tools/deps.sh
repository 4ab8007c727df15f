#!/usr/bin/env bash
# deps.sh: make sure the Debian packages the build needs are present.
# As root it installs what is missing with apt-get; otherwise it prints the
# exact command to run and fails.
set -euo pipefail
need=()
have_header() { [ -e "/usr/include/$1" ] || [ -e "/usr/include/x86_64-linux-gnu/$1" ] || [ -e "/usr/include/aarch64-linux-gnu/$1" ]; }
have_header jansson.h || need+=(libjansson-dev)
have_header pcre2.h || need+=(libpcre2-dev)
have_header utf8proc.h || need+=(libutf8proc-dev)
have_header microhttpd.h || need+=(libmicrohttpd-dev)
command -v clang >/dev/null || need+=(clang)
ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
command -v npm >/dev/null || need+=(npm)
command -v pkg-config >/dev/null || need+=(pkg-config)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "deps: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq "${need[@]}" >&2
else
    echo "deps: missing packages; run: sudo apt-get install -y ${need[*]}" >&2
    exit 1
fi
