#!/usr/bin/env bash
# install_check.sh: `make install` as a user runs it. Installs into a
# temporary PREFIX, builds examples/simple.c with `pkg-config --cflags
# --libs dflash` against that copy (the shared library) and runs it on the
# embedded pair; then installs with DESTDIR and checks every file landed
# under DESTDIR/PREFIX. Prints "RESULT <passed> <failed>" for tests/run.sh.
set -uo pipefail
B=${B:-build}
tmp=$(mktemp -d /tmp/dflash_install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
check() { # label, command...
    local label=$1; shift
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL install: $label"; fi
}
check "make install PREFIX" make -s B="$B" install PREFIX="$tmp/p" >/dev/null
export PKG_CONFIG_PATH="$tmp/p/lib/pkgconfig"
flags=$(pkg-config --cflags --libs dflash)
check "pkg-config names the prefix: $flags" grep -q -- "-I$tmp/p/include .*-L$tmp/p/lib -ldflash" <<<"$flags"
# -Wl,-rpath: the example finds the installed libdflash.so, not a built one
check "example builds against the installed copy" \
    ${CC:-cc} -std=c11 -Wall -Wextra -Werror -o "$tmp/simple" examples/simple.c $flags -Wl,-rpath,"$tmp/p/lib"
out=$("$tmp/simple" models/qwen3-pystd models/qwen3-pystd-dflash 2>&1)
check "example runs: $out" grep -q " generated tokens in .* steps; tau " <<<"$out"
check "example uses the shared library" grep -q "$tmp/p/lib/libdflash.so" <<<"$(ldd "$tmp/simple")"
check "make install DESTDIR" make -s B="$B" install DESTDIR="$tmp/d" PREFIX=/opt/df >/dev/null
for f in include/dflash.h lib/libdflash.a lib/libdflash.so lib/pkgconfig/dflash.pc bin/dflash; do
    check "DESTDIR/PREFIX/$f" test -f "$tmp/d/opt/df/$f"
done
check "dflash.pc under DESTDIR names PREFIX" grep -qx "prefix=/opt/df" "$tmp/d/opt/df/lib/pkgconfig/dflash.pc"
echo "RESULT $passed $failed"
[ "$failed" = 0 ]
