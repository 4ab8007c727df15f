#!/usr/bin/env bash
# run.sh: run every test executable (plain and sanitizer builds) that
# tests/test_*.c names, each under a time limit, then the fuzz targets for
# a bounded time; add up the RESULT lines into the closing
# "N passed, N failed" line. Exit status is non-zero if anything failed.
set -u
B=${B:-build}
# See src/cli/main.c: spinning OpenMP workers starve the main thread on a busy machine.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
passed=0 failed=0
# A test that hangs fails after this many seconds instead of stalling the
# run until CI's own limit.
timeout_s=${DFLASH_TEST_TIMEOUT:-900}
run_one() { # label, command...
    local label=$1; shift
    local out rc
    out=$(timeout -k 10 "$timeout_s" "$@" 2>&1); rc=$?
    [ $rc -eq 124 ] && out="$out
(timed out after ${timeout_s}s)"
    local res p f
    res=$(printf '%s\n' "$out" | grep '^RESULT ' | tail -n 1)
    if [ -n "$res" ]; then
        read -r _ p f <<<"$res"
    else
        p=0 f=1
    fi
    if [ $rc -ne 0 ] && [ "$f" = 0 ]; then f=1; fi
    passed=$((passed + p)); failed=$((failed + f))
    if [ "$f" != 0 ]; then
        printf '%s\n' "$out" | grep -v '^ok ' | tail -n 60
        echo "FAILED: $label (rc=$rc)"
    else
        echo "$label: $p passed"
    fi
}
# The tests the sources name (a binary left over from a deleted test does
# not run); a source whose binary is missing fails.
tests=$(cd tests && ls test_*.c | sed 's/\.c$//')
for n in $tests; do
    t=$B/tests/$n
    if [ -x "$t" ]; then run_one "$t" "$t"; else failed=$((failed + 1)); echo "FAILED: $t was not built"; fi
done
for n in $tests; do
    t=$B/asan/tests/$n
    [ -x "$t" ] || { failed=$((failed + 1)); echo "FAILED: $t was not built"; continue; }
    # The sanitizer pass covers the unit and parser tests; model-size tests
    # would take minutes under ASan and add no new code paths.
    case "$(basename "$t")" in test_slow_*) continue ;; esac
    run_one "$t" env ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 OMP_NUM_THREADS=1 "$t"
done
# The command-line regression tests again, driving the sanitizer build of
# the CLI (the test program itself is the plain one).
run_one "$B/tests/test_slow_cli_limits (asan dflash)" env DFLASH_BIN=$B/asan/dflash DFLASH_BIN_ASAN=1 \
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 "$B/tests/test_slow_cli_limits"
# The linear's thread pool under ThreadSanitizer, with more threads than
# cores so hand-overs interleave.
run_one "$B/tsan/test_cpu_gemm" env DFLASH_CPU_THREADS=4 TSAN_OPTIONS=halt_on_error=1 "$B/tsan/test_cpu_gemm"
# dflash serve driven by the openai npm client, plain and under the
# sanitizers (threads, streams, clients that leave).
run_one "tests/serve_check.sh" env B="$B" bash tests/serve_check.sh
run_one "tests/serve_check.sh (asan dflash)" env B="$B" DFLASH_BIN="$B/asan/dflash" DFLASH_BIN_ASAN=1 \
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 bash tests/serve_check.sh
# make install into temporary prefixes; the example built with pkg-config.
run_one "tests/install_check.sh" env B="$B" bash tests/install_check.sh
fuzz_secs=${DFLASH_FUZZ_SECONDS:-20}
for f in $B/fuzz/bin/fuzz_*; do
    [ -x "$f" ] || continue
    name=$(basename "$f")
    corpus=tests/fuzz/corpus/${name#fuzz_}
    work=$B/fuzz/work/$name; mkdir -p "$work"
    if "$f" -max_total_time="$fuzz_secs" -rss_limit_mb=2048 -print_final_stats=0 "$work" ${corpus:+$( [ -d "$corpus" ] && echo "$corpus")} >$B/fuzz/$name.log 2>&1; then
        passed=$((passed + 1)); echo "$name: ran ${fuzz_secs}s, no crash"
    else
        failed=$((failed + 1)); tail -n 40 $B/fuzz/$name.log; echo "FAILED: $name"
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
