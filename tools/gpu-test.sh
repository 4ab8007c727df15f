#!/usr/bin/env bash
# gpu-test.sh: the CUDA backend's checks and benchmarks on a GPU machine, one
# command from the repo root: `bash tools/gpu-test.sh` (env OUT: a folder
# that receives gpu-test-logs.tgz, every step's log; the device tool brings
# back only a few files). Steps, each listed with its seconds at the end:
#  1. builds, with gcc directly (not the Makefile: the GPU image may lack the
#     jansson/pcre2/utf8proc headers the full build needs), two programs from
#     only src/core, src/backend, src/backend/cpu, src/backend/cuda and the
#     host sampler (src/spec/sampler.c, sample_rows' reference):
#     tests/test_cuda_nvrtc.c and tools/cuda/cuda_ops_check.c;
#  2. runs test_cuda_nvrtc (NVRTC compile of every kernel, embedded sources
#     up to date, cache, backend creation on this GPU);
#  3. runs cuda_ops_check: every op against the CPU reference at real shapes,
#     batch invariance (a row alone == the row in a batch, bit for bit), then
#     op timings (us, GB/s);
#  4. model checks: builds tools/cuda/cuda_model_check.c with the whole
#     library (every src/**/*.c but src/cli), which needs jansson, pcre2-8
#     and utf8proc. When they do not link from the system, the .debs that
#     tools/gpu/fetch-debs.sh put in .debs/ (carried to the GPU machine:
#     carry [".debs"]) are unpacked with `dpkg -x` into $B/sysroot (never
#     into /) and the build points -I, -L and -Wl,-rpath there. Then runs it:
#     target (Qwen3, YaRN Qwen3, Llama, Qwen3-MoE, Qwen3.5 hybrids) and DFlash fixtures on the GPU vs
#     the CPU and the references with f32 and with bf16 KV pages, greedy
#     and speculative outputs, the embedded pair (spec == plain with the
#     full block and the auto width,
#     seeded sampling spec == plain, tau, tok/s, the widths auto chose);
#  5. benchmarks: builds the dflash CLI the same way and runs `dflash bench`
#     (seed drafter bf16 and fp8, and its propose for 4, 8 and 32
#     sequences, the Qwen3-8B drafter, the Qwen3-8B target
#     with verifies of 2..16 rows and with 4, 8 and 32 sequences per
#     forward (again with the many-row GEMM off, and with its 64-row
#     tile), the Llama 3.1 8B
#     target, the embedded pair's geometry), then the
#     PyTorch peers (tools/bench/torch_drafter_peer.py, torch_target_peer.py)
#     in the same run;
#  6. compute-sanitizer memcheck, racecheck, synccheck on cuda_ops_check
#     --small (slow, open-ended);
#  7. the big models' benches (the Qwen3-30B-A3B MoE target, the seed
#     pair: its drafter and its Qwen3.5-MoE hybrid target): each writes
#     61-70 GB of random weights on the host first, so they come last,
#     where the deadline cuts them before anything else;
#  8. prints the op tables, the model check's FAIL and info rows, the bench
#     tables, then a summary table last. Exit status non-zero if anything
#     failed.
# A step that would start after GPU_TEST_DEADLINE seconds (default 540) is
# skipped and listed as such, and every step (the A/B benches and the sweep
# included) is cut at its own limit or 50 s past the deadline, whichever is
# first, so the run and its summary end inside a 600 s device call.
# Knobs: GPU_TEST_ONLY=check (1-4, 6) | bench (5, 7) | model (4) | all (default);
# GPU_TEST_NCU=1 adds an Nsight Compute profile of one propose's kernels
# (GPU_TEST_NCU_KERNELS: a regex, GPU_TEST_NCU_COUNT: how many launches,
# GPU_TEST_NCU_SKIP: matching launches skipped first, to land past the
# warm-up; GPU_TEST_NCU_BENCH: the bench arguments of the profiled run,
# default one seed-drafter propose; stall reasons and the hottest
# instructions included);
# GPU_TEST_NCU_OPS=TEXT adds Nsight Compute (same sections) on the kernels
# of one call of each timed op of cuda_ops_check whose "op shape" contains
# TEXT or one of its '|'-separated parts (e.g. "attention bf16"; with
# GPU_TEST_OPS_ONLY to skip the rest), printed with every detail into
# ncu_ops.txt and, per SASS instruction, into ncu_ops_source.csv;
# GPU_TEST_PROBE=1 builds and runs tools/cuda/stream_probe.cu (GB/s of
# register, cp.async and bulk-copy load disciplines) and
# tools/cuda/handoff_probe.cu (us a short kernel adds to a graph's chain:
# stream order, programmatic dependent launch, a counter, clusters) and
# tools/cuda/layer_probe.cu (us a seed drafter's and a Qwen3-8B layer's
# weight streams and time phases take as a kernel a phase, with and
# without the time phases asking L2 for the next weights, or as one kernel
# with a shared-memory ring; GPU_TEST_PROBE=layer runs that one alone);
# GPU_TEST_SKIP: a regex of step names not to run (e.g.
# "memcheck|racecheck|synccheck|peer-.*" for a profiling run; skipping
# "sysroot", where it runs, leaves the model check and the CLI unbuilt);
# GPU_TEST_TRACE=1 adds every kernel's start and end as the GPU ran them
# (CUPTI kernel records of a `dflash bench`, tools/cuda/kernel_trace.c;
# GPU_TEST_TRACE_BENCH: its arguments, several sets separated by ';',
# each traced on its own), summarised per kernel of the largest graph
# (tools/cuda/kernel_trace.py), overlaps included;
# GPU_TEST_STAMPS=1 adds each stamped block's phases (GEMM, attention,
# merge, norms) in benches of the stamps build (tools/cuda/block_stamps.py; GPU_TEST_STAMPS_BENCH: ';'-
# separated bench arguments, GPU_TEST_STAMPS_SETS: more runs of the first
# with variables set);
# GPU_TEST_NCU_TIMES=1 adds the duration of every kernel of a seed-drafter
# bench (CSV in the logs; GPU_TEST_NCU_TIMES_BENCH: other bench arguments); GPU_TEST_AB=FILE.tar (a `git archive` of another
# commit) builds that tree's CLI too and alternates the two benches
# (GPU_TEST_AB_BENCH: other bench arguments, several sets separated by
# ';', each a bench of its own; GPU_TEST_AB_ROUNDS: rounds,
# default 2, GPU_TEST_AB_LIMIT: the step's seconds, default 200);
# GPU_TEST_AB_OPS=SECTION,...: each round also times those sections of
# cuda_ops_check on both sides (the baseline's own ops check, built too);
# GPU_TEST_AB_ENV="VAR=VALUE ..." runs "this" side with those variables
# (alone: the same binary with and without them; the ops check runs once
# more with them too);
# GPU_TEST_SWEEP="VAR=V ...;VAR=W ...": the same binary once without and
# then with each ';'-separated setting, each run the A/B's benches
# (GPU_TEST_AB_BENCH, else its default two) and ops sections
# (GPU_TEST_AB_OPS), e.g. "DFLASH_CUDA_GEMM_SPLIT=2;DFLASH_CUDA_GEMM_SPLIT=4"
# (seconds: GPU_TEST_AB_LIMIT);
# GPU_TEST_OPS_ONLY=SECTION,...: cuda_ops_check's sections to run in the
# ops check and under the sanitizers (all by default; its usage lists them:
# a quicker check of the ops a change touched);
# GPU_TEST_E2E="VAR=VALUE ..." times whole generations of the embedded
# pair with and without those variables (tools/bench/e2e_ab.sh, steps
# e2e-16 and e2e-auto; GPU_TEST_E2E_DEVICE=cpu to try it without a GPU);
# GPU_TEST_MODEL_ENV="VAR=VALUE ..." runs the model check a second time
# with those variables (a lever's setting checked before it becomes the
# default); GPU_TEST_PEER_CTX: the target peer's contexts (default
# 1,4096); GPU_TEST_SYSROOT=force uses the .debs sysroot even when the system has the
# libraries; MODEL_CHECK_ARGS are passed to cuda_model_check (e.g.
# --cpu-as-gpu, to check this script on a machine without a GPU);
# GPU_TEST_BUILD: the build folder (default build-gpu-test).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dflash-gpu-test}
mkdir -p "$OUT"
B=${GPU_TEST_BUILD:-build-gpu-test}
LOG=$B/logs
rm -rf "$LOG"
mkdir -p "$B" "$LOG"
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
DEADLINE=${GPU_TEST_DEADLINE:-540}
OPS_ONLY=${GPU_TEST_OPS_ONLY:+--only $GPU_TEST_OPS_ONLY}
names=() rcs=() secs=()
# limited SECONDS FUNCTION ARGS...: what `timeout` does, for a shell
# function (the A/B benches, the sweep, the builds): it runs in a process
# group of its own, which gets TERM at the limit (KILL 5 s later), so the
# programs it started end with it; status 124 then, as timeout's.
limited() {
    local limit=$1 t0=$SECONDS pid dog rc
    shift
    set -m # job control: the background job below leads its own process group
    "$@" &
    pid=$!
    set +m
    # the watchdog writes nowhere: an open output would keep a pipe after it alive
    (sleep "$limit" && kill -TERM -- "-$pid" && sleep 5 && kill -KILL -- "-$pid") >/dev/null 2>&1 &
    dog=$!
    wait "$pid"
    rc=$?
    kill "$dog" 2>/dev/null
    [ $((SECONDS - t0)) -ge "$limit" ] && [ "$rc" -ge 128 ] && rc=124
    return "$rc"
}
step() { # name, log file, timeout seconds, command...
    local name=$1 log=$2 limit=$3; shift 3
    if [ -n "${GPU_TEST_SKIP:-}" ] && [[ "$name" =~ ^(${GPU_TEST_SKIP})$ ]]; then
        echo "=== $name: skipped (GPU_TEST_SKIP)"
        names+=("$name"); rcs+=("not-asked"); secs+=(0)
        return
    fi
    if [ "$SECONDS" -ge "$DEADLINE" ]; then
        echo "=== $name: skipped (${SECONDS}s >= deadline ${DEADLINE}s)"
        names+=("$name"); rcs+=("skipped"); secs+=(0)
        return
    fi
    local left=$((DEADLINE + 50 - SECONDS))
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== $name (limit ${limit}s): $*"
    local t0=$SECONDS
    if [ "$(type -t "$1")" = function ]; then # timeout cannot run a shell function
        limited "$limit" "$@" 2>&1 | tee "$LOG/$log"
    else
        timeout -k 5 "$limit" "$@" 2>&1 | tee "$LOG/$log"
    fi
    local rc=${PIPESTATUS[0]}
    names+=("$name"); rcs+=("$rc"); secs+=("$((SECONDS - t0))")
    echo "=== $name: rc=$rc"
}
last_ok() { [ "${rcs[${#rcs[@]}-1]}" = 0 ]; }
ONLY=${GPU_TEST_ONLY:-all}
want() { # group: check | bench | model
    case "$ONLY" in all) return 0 ;; "$1") return 0 ;; check) [ "$1" = model ] ;; *) return 1 ;; esac
}

# the library without the model code (the check programs' sources), as
# listed in the current folder: this tree's, or a baseline's (GPU_TEST_AB)
lib_sources() {
    echo "$(ls src/core/*.c) src/backend/backend.c src/backend/stage_moe.c $(ls src/backend/cpu/*.c) $(ls src/backend/cuda/*.c) src/spec/sampler.c"
}
SRC="$(lib_sources)"
CFLAGS="-std=c11 -O2 -g -Wall -Wextra -Werror -Iinclude -Isrc -Itests -D_GNU_SOURCE"
OMP=-fopenmp
echo 'int main(void){return 0;}' >"$B/omp.c"
gcc -fopenmp "$B/omp.c" -o "$B/omp" 2>/dev/null || OMP=-Wno-unknown-pragmas
build() { # output, main source
    gcc $CFLAGS $OMP -o "$1" "$2" $SRC -ldl -lm
}
{
    echo "gcc: $(gcc --version | head -n 1)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>&1 || true
    python3 -c 'import torch; print("torch", torch.__version__)' 2>&1 || true
} | tee "$LOG/env.txt"
if want check; then
    step build-nvrtc-test build.txt 120 build "$B/test_cuda_nvrtc" tests/test_cuda_nvrtc.c
    step build-ops-check build2.txt 120 build "$B/cuda_ops_check" tools/cuda/cuda_ops_check.c
    step nvrtc-test nvrtc_test.txt 120 env DFLASH_EXPECT_GPU=1 "$B/test_cuda_nvrtc"
    step ops-check ops_check.txt 240 "$B/cuda_ops_check" $OPS_ONLY
    # GPU_TEST_AB_ENV: the same checks under the lever being compared
    [ -n "${GPU_TEST_AB_ENV:-}" ] && [ -x "$B/cuda_ops_check" ] && step ops-check-env ops_check_env.txt 240 env $GPU_TEST_AB_ENV "$B/cuda_ops_check" $OPS_ONLY
fi
# GPU_TEST_NCU_OPS=TEXT: Nsight Compute on one more call of each timed op
# whose "op shape" contains TEXT (cuda_ops_check --profile): every kernel
# of those calls and nothing else.
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
NCU_SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis
    --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section SourceCounters
    --section InstructionStats"
# The report is saved, then printed twice: every section with its details
# (stall reasons included), and the source page (every SASS instruction
# with its executions and stall samples, CSV) for reading off line by line.
if want check && [ -n "${GPU_TEST_NCU_OPS:-}" ] && [ -n "$NCU" ] && [ -x "$B/cuda_ops_check" ]; then
    step ncu-ops ncu_ops_run.txt 240 "$NCU" --clock-control none --profile-from-start off $NCU_SECTIONS \
        --import-source yes --export "$B/ncu_ops" --force-overwrite "$B/cuda_ops_check" $OPS_ONLY --profile "$GPU_TEST_NCU_OPS"
    if last_ok; then
        step ncu-ops-details ncu_ops.txt 60 "$NCU" --import "$B/ncu_ops.ncu-rep" --print-details all
        step ncu-ops-source ncu_ops_source.csv 60 "$NCU" --import "$B/ncu_ops.ncu-rep" --page source --csv \
            --print-source sass
    fi
fi

# ---- the full library (model check, CLI) ----
LIBS="-ljansson -lpcre2-8 -lutf8proc"
CLI_LIBS="-lmicrohttpd -lpthread" # dflash serve
SR=$PWD/$B/sysroot # absolute: the baseline build (GPU_TEST_AB) runs in another folder
system_libs_ok() { # the four headers compile and the libraries link
    printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <jansson.h>\n#include <pcre2.h>\n#include <utf8proc.h>\n#include <microhttpd.h>\nint main(void){json_decref(json_object());return utf8proc_version()==0 || MHD_get_version()==0;}\n' >"$B/libs.c"
    gcc "$B/libs.c" -o "$B/libs" $LIBS $CLI_LIBS 2>/dev/null
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
    ls "$SR/usr/include/jansson.h" "$SR/usr/include/pcre2.h" "$SR/usr/include/utf8proc.h" "$SR/usr/include/microhttpd.h" &&
        find "$SR" -name 'libjansson.so' -o -name 'libpcre2-8.so' -o -name 'libutf8proc.so'
}
MFLAGS=""
lib_ready=0
no_libs=no-libs # the reason the model check and the CLI were not built
if want model || want bench; then
    if [ "${GPU_TEST_SYSROOT:-}" != force ] && system_libs_ok; then
        echo "full library: jansson/pcre2/utf8proc from the system"
        lib_ready=1
    else
        echo "full library: jansson/pcre2/utf8proc not usable from the system (or GPU_TEST_SYSROOT=force): sysroot $SR from .debs/"
        step sysroot sysroot.txt 60 make_sysroot
        last_ok && lib_ready=1
        [ "${rcs[${#rcs[@]}-1]}" = not-asked ] && no_libs="no-libs: sysroot skipped, the model check and the CLI need it"
        LIBDIR=$(dirname "$(find "$SR" -name 'libjansson.so' 2>/dev/null | head -n 1)")
        LIBDIR=$(cd "$LIBDIR" 2>/dev/null && pwd)
        MFLAGS="-I$SR/usr/include -L$LIBDIR -Wl,-rpath,$LIBDIR"
    fi
fi
MSRC=$(find src -name '*.c' ! -path 'src/cli/*' | sort)
if want model; then
    if [ "$lib_ready" = 1 ]; then
        build_model() {
            gcc $CFLAGS $OMP $MFLAGS -o "$B/cuda_model_check" tools/cuda/cuda_model_check.c $MSRC $LIBS -ldl -lm &&
                { ldd "$B/cuda_model_check" | grep -E 'jansson|pcre2|utf8proc' || true; }
        }
        step build-model-check build3.txt 120 build_model
        if last_ok; then
            step model-check model_check.txt 240 "$B/cuda_model_check" ${MODEL_CHECK_ARGS:-}
            # GPU_TEST_MODEL_ENV="VAR=VALUE ...": once more under those levers
            [ -n "${GPU_TEST_MODEL_ENV:-}" ] && step model-check-env model_check_env.txt 240 \
                env $GPU_TEST_MODEL_ENV "$B/cuda_model_check" ${MODEL_CHECK_ARGS:-}
        else
            names+=("model-check"); rcs+=("not-built"); secs+=(0)
        fi
    else
        names+=("model-check"); rcs+=("$no_libs"); secs+=(0)
    fi
fi

# ---- 5. benchmarks: dflash bench, then the PyTorch peers, same run ----
if want bench; then
    if [ "$lib_ready" = 1 ]; then
        build_cli() {
            gcc $CFLAGS $OMP $MFLAGS -o "$B/dflash" $(ls src/cli/*.c) $MSRC $LIBS $CLI_LIBS -ldl -lm
        }
        step build-cli build4.txt 120 build_cli
        if last_ok; then
            D="$B/dflash bench --device cuda"
            step bench-seed bench_seed.txt 120 $D --preset seed-drafter --ctx 512,4096
            step bench-seed-sessions bench_seed_sessions.txt 150 $D --preset seed-drafter --ctx 1024 \
                --sessions 4,8,32 --reps 10
            step bench-seed-nopdl bench_seed_nopdl.txt 120 env DFLASH_CUDA_PDL=0 $D --preset seed-drafter --ctx 4096
            step bench-seed-fp8 bench_seed_fp8.txt 120 $D --preset seed-drafter --ctx 512,4096 --drafter-quant fp8
            step bench-8b-drafter bench_8b_drafter.txt 120 $D --preset qwen3-8b-drafter --ctx 4096
            step bench-8b-target bench_8b_target.txt 180 $D --preset qwen3-8b-target --ctx 1,4096 --rows 2,4,8,16
            step bench-llama-target bench_llama_target.txt 120 $D --preset llama31-8b-target --ctx 1,4096
            step bench-8b-sessions bench_8b_sessions.txt 200 $D --preset qwen3-8b-target --ctx 1024 --sessions 4,8,32 --rows 2,4,8,16 \
                --reps 10
            # the same sessions with every GEMM on gemm.cu's launches of at
            # most 64 rows (the many-row kernel off; same bits, for its A/B)
            step bench-8b-sessions-narrow bench_8b_sessions_narrow.txt 200 env DFLASH_CUDA_GEMM_WIDE=1073741824 \
                $D --preset qwen3-8b-target --ctx 1024 --sessions 4,8,32 --reps 10
            # the many-row kernel with 64-row tiles (its choice is 128 at
            # these sizes; same bits, for the tile's A/B)
            step bench-8b-sessions-t64 bench_8b_sessions_t64.txt 200 env DFLASH_CUDA_GEMM_TILE=64 \
                $D --preset qwen3-8b-target --ctx 1024 --sessions 8,32 --rows 4,8,16 --reps 10
            step bench-pystd bench_pystd.txt 60 $D --preset pystd --ctx 1,256 --rows 1,2,4,8,16
            # The big models, run after the sanitizers (big_benches below):
            # each spends minutes writing its random weights on the host.
            big_benches() {
                # Qwen3-30B-A3B (61 GB of random weights built on the host,
                # then copied): rows grouped by expert
                step bench-30b-moe bench_30b_moe.txt 300 $D --preset qwen3-30b-a3b-target --ctx 1,1024 --rows 4,16 \
                    --sessions 8 --reps 5
                # the seed's own pair: its drafter and the Qwen3.5-MoE hybrid
                # it serves (70 GB of random weights)
                step bench-seed-pair bench_seed_pair.txt 300 $D --preset seed-pair \
                    --ctx 1,1024 --rows 4,16 --reps 5
            }
        fi
    else
        names+=("bench"); rcs+=("$no_libs"); secs+=(0)
    fi
    # Same-run comparisons. GPU_TEST_AB=FILE.tar: a baseline tree (`git
    # archive` of another commit, carried to the machine); its CLI is built
    # like this one's and the two alternate, two rounds of the seed propose
    # and the 8B verify + decode at ctx 4096. GPU_TEST_SPLITS="2 4 8": the
    # seed propose and the 8B target with DFLASH_CUDA_GEMM_SPLIT at each.
    # GPU_TEST_AB_ENV="VAR=VALUE ...": "this" runs with those variables set
    # (the baseline without them; with no GPU_TEST_AB, the same binary).
    if { [ -n "${GPU_TEST_AB:-}" ] || [ -n "${GPU_TEST_AB_ENV:-}" ]; } && [ -x "$B/dflash" ]; then
        ab_build() {
            rm -rf "$B/ab" && mkdir -p "$B/ab" && tar -xf "$GPU_TEST_AB" -C "$B/ab" &&
                (cd "$B/ab" && gcc $CFLAGS $OMP $MFLAGS -o dflash $(ls src/cli/*.c) \
                    $(find src -name '*.c' ! -path 'src/cli/*' | sort) $LIBS $CLI_LIBS -ldl -lm &&
                    if [ -n "${GPU_TEST_AB_OPS:-}" ]; then
                        gcc $CFLAGS $OMP -o cuda_ops_check tools/cuda/cuda_ops_check.c $(lib_sources) -ldl -lm
                    fi) &&
                # this side's ops check too when the check steps did not run
                # (GPU_TEST_ONLY=bench)
                if [ -n "${GPU_TEST_AB_OPS:-}" ] && [ ! -x "$B/cuda_ops_check" ]; then
                    gcc $CFLAGS $OMP -o "$B/cuda_ops_check" tools/cuda/cuda_ops_check.c $(lib_sources) -ldl -lm
                fi
        }
        ab_bench() {
            local round who bin
            for round in $(seq "${GPU_TEST_AB_ROUNDS:-2}"); do
                for who in this baseline; do
                    bin="$B/dflash"
                    [ "$who" = baseline ] && [ -n "${GPU_TEST_AB:-}" ] && bin="$B/ab/dflash"
                    [ "$who" = this ] && [ -n "${GPU_TEST_AB_ENV:-}" ] && bin="env $GPU_TEST_AB_ENV $B/dflash"
                    echo "### $who, round $round"
                    if [ -n "${GPU_TEST_AB_OPS:-}" ]; then
                        local ops="$B/cuda_ops_check"
                        [ "$who" = baseline ] && [ -n "${GPU_TEST_AB:-}" ] && ops="$B/ab/cuda_ops_check"
                        [ "$who" = this ] && [ -n "${GPU_TEST_AB_ENV:-}" ] && ops="env $GPU_TEST_AB_ENV $ops"
                        $ops --only "$GPU_TEST_AB_OPS" | sed -n '/shape (timed)/,/^$/p' || return 1
                    fi
                    if [ -n "${GPU_TEST_AB_BENCH:-}" ]; then
                        local args ab_sets
                        IFS=';' read -ra ab_sets <<<"$GPU_TEST_AB_BENCH"
                        for args in "${ab_sets[@]}"; do
                            $bin bench --device cuda $args || return 1
                        done
                        continue
                    fi
                    $bin bench --device cuda --preset seed-drafter --ctx 4096 || return 1
                    $bin bench --device cuda --preset qwen3-8b-target --ctx 4096 --rows 16 || return 1
                done
            done
        }
        [ -n "${GPU_TEST_AB:-}" ] && step ab-build ab_build.txt 120 ab_build
        if [ -z "${GPU_TEST_AB:-}" ] || last_ok; then
            step ab-bench ab_bench.txt ${GPU_TEST_AB_LIMIT:-200} ab_bench
        fi
    fi
    if [ -n "${GPU_TEST_SWEEP:-}" ] && [ -x "$B/dflash" ]; then
        sweep() {
            local set envs args sets ab_sets
            IFS=';' read -ra sets <<<"-;$GPU_TEST_SWEEP"
            IFS=';' read -ra ab_sets <<<"${GPU_TEST_AB_BENCH:---preset seed-drafter --ctx 4096;--preset qwen3-8b-target --ctx 4096 --rows 16}"
            if [ -n "${GPU_TEST_AB_OPS:-}" ] && [ ! -x "$B/cuda_ops_check" ]; then
                build "$B/cuda_ops_check" tools/cuda/cuda_ops_check.c || return 1
            fi
            for set in "${sets[@]}"; do
                envs=$set
                [ "$set" = - ] && envs=""
                echo "### sweep: ${envs:-no variables}"
                if [ -n "${GPU_TEST_AB_OPS:-}" ]; then
                    env $envs "$B/cuda_ops_check" --only "$GPU_TEST_AB_OPS" | sed -n '/shape (timed)/,/^$/p' || return 1
                fi
                for args in "${ab_sets[@]}"; do
                    env $envs "$B/dflash" bench --device cuda $args || return 1
                done
            done
        }
        step sweep sweep.txt ${GPU_TEST_AB_LIMIT:-200} sweep
    fi
    # GPU_TEST_E2E="VAR=V ...": whole generations of the embedded pair
    # through `dflash generate`, the same binary without and with those
    # variables alternated (tools/bench/e2e_ab.sh, 5 rounds; single
    # prompts at block 16, then at the auto width).
    if [ -n "${GPU_TEST_E2E:-}" ] && [ -x "$B/dflash" ]; then
        for w in 16 auto; do
            step "e2e-$w" "e2e_$w.txt" 150 env B="$B" DEVICE="${GPU_TEST_E2E_DEVICE:-cuda}" ROUNDS=5 WIDTH=$w \
                bash tools/bench/e2e_ab.sh "$GPU_TEST_E2E"
        done
    fi
    # GPU_TEST_PROBE=1: tools/cuda/stream_probe.cu (nvcc), how loads must
    # be issued to stream a buffer at the DRAM rate; tools/cuda/handoff_probe.cu,
    # what one kernel-to-kernel hand-off costs; tools/cuda/layer_probe.cu,
    # whether a layer's weights can stream through its dependent chain
    # (GPU_TEST_PROBE=layer: that one alone).
    if [ "${GPU_TEST_PROBE:-0}" = 1 ]; then
        step stream-probe-build build5.txt 120 nvcc -O3 -arch=sm_90a -std=c++17 -o "$B/stream_probe" tools/cuda/stream_probe.cu
        last_ok && step stream-probe stream_probe.txt 120 "$B/stream_probe"
        step handoff-probe-build build7.txt 120 nvcc -O3 -arch=sm_90a -std=c++17 -o "$B/handoff_probe" tools/cuda/handoff_probe.cu
        last_ok && step handoff-probe handoff_probe.txt 60 "$B/handoff_probe"
    fi
    if [ "${GPU_TEST_PROBE:-0}" = 1 ] || [ "${GPU_TEST_PROBE:-0}" = layer ]; then
        step layer-probe-build build8.txt 120 nvcc -O3 -arch=sm_90a -std=c++17 -o "$B/layer_probe" tools/cuda/layer_probe.cu
        last_ok && step layer-probe layer_probe.txt 120 "$B/layer_probe"
    fi
    # Nsight Compute on the kernels of one propose (GPU_TEST_NCU=1; clocks
    # left alone): why a kernel is slow, not guessed.
    if [ "${GPU_TEST_NCU:-0}" = 1 ] && [ -n "$NCU" ] && [ -x "$B/dflash" ]; then
        step ncu ncu.txt 200 "$NCU" --clock-control none -k "regex:${GPU_TEST_NCU_KERNELS:-attention_tc|attn_combine|gemm_bf16_2}" \
            --launch-skip "${GPU_TEST_NCU_SKIP:-0}" --launch-count "${GPU_TEST_NCU_COUNT:-10}" $NCU_SECTIONS \
            "$B/dflash" bench --device cuda ${GPU_TEST_NCU_BENCH:---preset seed-drafter --ctx 4096 --reps 1}
    fi
    # GPU_TEST_NCU_TIMES=1: the duration of every kernel of a seed-drafter
    # bench (one metric, one replay pass each: fast), as CSV; the last
    # propose's kernels against its end-to-end time show what the gaps
    # between kernels cost. Bench arguments with `--profile OP`: only that
    # call's kernels (the large presets' weights are built unprofiled).
    if [ "${GPU_TEST_NCU_TIMES:-0}" = 1 ] && [ -n "$NCU" ] && [ -x "$B/dflash" ]; then
        TB=${GPU_TEST_NCU_TIMES_BENCH:---preset seed-drafter --ctx 4096 --reps 1}
        FROM=""
        [[ " $TB " == *" --profile "* ]] && FROM="--profile-from-start off"
        step ncu-times-seed ncu_times_seed.txt 300 "$NCU" --clock-control none $FROM --metrics gpu__time_duration.sum \
            --csv --print-units base "$B/dflash" bench --device cuda $TB
    fi
    # GPU_TEST_TRACE=1: every kernel's start and end as the GPU ran it
    # (tools/cuda/kernel_trace.c, CUPTI kernel records through
    # LD_PRELOAD: graph replays with their overlaps, unlike Nsight
    # Compute's kernels alone), summarised per kernel of the largest
    # graph by tools/cuda/kernel_trace.py; GPU_TEST_TRACE_BENCH: the
    # bench arguments (default a seed-drafter propose at ctx 4096).
    if [ "${GPU_TEST_TRACE:-0}" = 1 ] && [ -x "$B/dflash" ]; then
        build_trace() { # the newest kernel record struct this CUPTI has
            local cuda lib v
            cuda=$(dirname "$(dirname "$(command -v nvcc)")")
            lib=$(dirname "$(find "$cuda"/ /usr/local/cuda*/extras -name 'libcupti.so' 2>/dev/null | head -n 1)")
            for v in 14 13 12 11 10 9; do
                gcc -std=c11 -O2 -Wall -shared -fPIC -DKREC=CUpti_ActivityKernel$v -I"$cuda/include" \
                    -I"$cuda/extras/CUPTI/include" -o "$B/libkernel_trace.so" tools/cuda/kernel_trace.c \
                    -L"$lib" -Wl,-rpath,"$lib" -lcupti 2>/dev/null && { echo "CUpti_ActivityKernel$v, $lib"; return 0; }
            done
            echo "no CUpti_ActivityKernelN compiled against $cuda/include"
            return 1
        }
        step build-trace build6.txt 60 build_trace
        if last_ok; then
            IFS=';' read -ra trace_sets <<<"${GPU_TEST_TRACE_BENCH:---preset seed-drafter --ctx 4096 --reps 10}"
            for i in "${!trace_sets[@]}"; do
                step "trace-$i" "trace_run_$i.txt" 200 env DFLASH_KERNEL_TRACE="$LOG/kernel_trace_$i.csv" \
                    LD_PRELOAD="$(cd "$B" && pwd)/libkernel_trace.so" "$B/dflash" bench --device cuda ${trace_sets[$i]}
                last_ok && step "trace-summary-$i" "kernel_trace_$i.txt" 60 \
                    python3 tools/cuda/kernel_trace.py --graphs 2 "$LOG/kernel_trace_$i.csv"
            done
        fi
    fi
    # GPU_TEST_STAMPS=1: `dflash bench` of the stamps build
    # (DFLASH_CUDA_STAMPS: the phases of every block of the kernels that
    # stamp, common.cuh), summarised per GEMM shape and on one timeline by
    # tools/cuda/block_stamps.py; GPU_TEST_STAMPS_BENCH:
    # the bench arguments (default a seed-drafter propose at ctx 4096),
    # several sets separated by ';', each a run; GPU_TEST_STAMPS_SETS=
    # "VAR=V ...;...": the first set run once more with each setting.
    # The records stay in $B/stamps (too large to bring back).
    if [ "${GPU_TEST_STAMPS:-0}" = 1 ] && [ -x "$B/dflash" ]; then
        stamps_run() { # name, env settings (or ""), bench arguments
            local bin="$B/stamps/$1.bin"
            rm -f "$bin"
            step "stamps-$1" "stamps_run_$1.txt" 200 env $2 DFLASH_CUDA_STAMPS="$bin" "$B/dflash" bench --device cuda $3
            last_ok && step "stamps-summary-$1" "block_stamps_$1.txt" 60 \
                bash -c "echo 'bench: $3; settings: ${2:-none}'; python3 tools/cuda/block_stamps.py '$bin'"
        }
        mkdir -p "$B/stamps"
        IFS=';' read -ra stamp_bench <<<"${GPU_TEST_STAMPS_BENCH:---preset seed-drafter --ctx 4096 --reps 10}"
        for i in "${!stamp_bench[@]}"; do
            stamps_run "$i" "" "${stamp_bench[$i]}"
        done
        if [ -n "${GPU_TEST_STAMPS_SETS:-}" ]; then
            IFS=';' read -ra stamp_sets <<<"$GPU_TEST_STAMPS_SETS"
            for i in "${!stamp_sets[@]}"; do
                stamps_run "0-set$i" "${stamp_sets[$i]}" "${stamp_bench[0]}"
            done
        fi
    fi
    P="python3 tools/bench/torch_drafter_peer.py --device cuda"
    step peer-seed peer_seed.txt 150 $P --preset seed-drafter --ctx 512,4096
    step peer-8b-drafter peer_8b_drafter.txt 150 $P --preset qwen3-8b-drafter --ctx 4096
    step peer-target peer_target.txt 240 python3 tools/bench/torch_target_peer.py --ctx "${GPU_TEST_PEER_CTX:-1,4096}"
fi

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/compute-sanitizer/compute-sanitizer /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
if want check && [ -x "$B/cuda_ops_check" ]; then
    if [ -n "$SAN" ]; then
        # The small run only: sanitizers slow kernels 10-100x. Kernels come
        # from the disk cache the full run filled.
        step memcheck memcheck.txt 200 "$SAN" --tool memcheck --leak-check full --error-exitcode 3 "$B/cuda_ops_check" --small $OPS_ONLY
        step racecheck racecheck.txt 200 "$SAN" --tool racecheck --error-exitcode 3 "$B/cuda_ops_check" --small $OPS_ONLY
        step synccheck synccheck.txt 200 "$SAN" --tool synccheck --error-exitcode 3 "$B/cuda_ops_check" --small $OPS_ONLY
    else
        echo "compute-sanitizer: NOT FOUND (looked on PATH and under /usr/local/cuda); sanitizer steps not run"
        names+=("sanitizers"); rcs+=("not-found"); secs+=(0)
    fi
fi

if want bench && [ "$(type -t big_benches)" = function ]; then
    big_benches
fi

# Tables last: timings and parity from the full check, the model check's
# table, the benches, then the steps.
echo
if [ -f "$LOG/ops_check.txt" ]; then
    sed -n '/^op  *shape (timed)/,/^$/p' "$LOG/ops_check.txt"
    grep -E '^(op  *shape  *max err|.* FAIL$)' "$LOG/ops_check.txt" | head -n 40
    grep '^RESULT' "$LOG/ops_check.txt" || true
    echo
fi
if [ -f "$LOG/model_check.txt" ]; then
    # The full table is in model_check.txt: here its FAIL and info rows.
    grep -E '^(  (plain|spec|speedup)|cuda_model_check:)' "$LOG/model_check.txt"
    grep -E '^check  *value  *bound  *result$| FAIL$|info\)|^RESULT' "$LOG/model_check.txt"
    echo
fi
for f in bench_seed bench_seed_sessions bench_seed_nopdl bench_seed_fp8 bench_8b_drafter bench_8b_target bench_llama_target bench_8b_sessions bench_8b_sessions_narrow bench_8b_sessions_t64 bench_pystd bench_30b_moe bench_seed_pair ab_bench sweep stream_probe handoff_probe layer_probe peer_seed peer_8b_drafter peer_target; do
    [ -f "$LOG/$f.txt" ] || continue
    echo "--- $f"
    [ "$f" = layer_probe ] && { cat "$LOG/$f.txt"; continue; }
    grep -E '^(###|bandwidth|device|torch_|cuBLAS|op |matrix|propose|verify|decode|step |seed |8b |lm head|stream_probe|discipline|reg |cp.async|bulk|way |stream |pdl |flag |cluster )' "$LOG/$f.txt"
done
tar -czf "$OUT/gpu-test-logs.tgz" -C "$LOG" . && echo "logs: $OUT/gpu-test-logs.tgz"
echo
printf '%-18s %-6s %s\n' step secs result
fail=0
for i in "${!names[@]}"; do
    r=${rcs[$i]}
    if [ "$r" = 0 ]; then s=ok; elif [ "$r" = not-asked ]; then s="skipped (GPU_TEST_SKIP)"; else s="FAIL (rc=$r)"; fail=1; fi
    printf '%-18s %-6s %s\n' "${names[$i]}" "${secs[$i]}" "$s"
done
exit $fail
