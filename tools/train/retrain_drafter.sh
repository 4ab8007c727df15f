#!/usr/bin/env bash
# retrain_drafter.sh: retrain only the embedded pair's drafter against the
# shipped target (models/qwen3-pystd, which stays as it is), on the GPU
# machine. Run from the repo root with OUT set to the folder whose files
# come back:
#
#   OUT=/some/dir bash tools/train/retrain_drafter.sh NAME:KNOB=V,KNOB=V [NAME:...]
#
# Each argument is one run of tools/train/train_dflash.py with the knobs of
# its docstring (DRAFT_LAYERS, DRAFT_BATCH, DRAFT_LR, DRAFT_SECONDS,
# DRAFT_TOTAL_SECONDS, DRAFT_INIT, DRAFT_INIT_MODEL, DRAFT_TAPS as 1+3+5,
# DRAFT_KL, EVAL_PLAIN, ...); several run at once on
# the one GPU (the models are small), after one shared preparation of the
# token streams and the pool (DRAFT_PREP_ONLY). A knob DRAFT_INIT=NAME
# resumes from build/retrain/NAME/ckpt (a previous run's checkpoint, kept on
# the machine or carried back to it).
#
# Each run's folder is build/retrain/NAME (models/qwen3-pystd-dflash,
# models/pystd-pair.json, ckpt/, log.txt); what comes back is
# $OUT/NAME.tar, split in 15 MB pieces ($OUT/NAME.tar.aa, .ab, ...): unpack
# with `cat NAME.tar.* | tar -x -C build/retrain`. Exit status: non-zero if
# any run failed.
set -euo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the folder whose files come back}"
[ $# -ge 1 ] || { sed -n '2,22p' "$0"; exit 2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-python3}
R="$ROOT/build/retrain"
WORK="$R/work"
mkdir -p "$OUT" "$WORK"
cd "$ROOT"

# a run's folder: the shipped target (linked) and its own outputs
setup() {
    mkdir -p "$R/$1/models"
    ln -sfn "$ROOT/models/qwen3-pystd" "$R/$1/models/qwen3-pystd"
}

setup prep
echo "=== retrain_drafter: prep $(date -u)"
DRAFT_WORK="$WORK" DRAFT_PREP_ONLY=1 "$PY" tools/train/train_dflash.py "$R/prep" 2>&1 | tee "$OUT/prep.log"

pids=() names=()
for spec in "$@"; do
    name=${spec%%:*}
    knobs=${spec#*:}
    [ "$knobs" != "$spec" ] || knobs=
    setup "$name"
    env_args=("DRAFT_WORK=$WORK")
    IFS=, read -ra kv <<<"$knobs"
    for a in "${kv[@]}"; do
        case $a in
        DRAFT_INIT=*)
            from=${a#DRAFT_INIT=}
            [ -f "$R/$from/ckpt/state.json" ] || { echo "retrain_drafter: no checkpoint $R/$from/ckpt" >&2; exit 2; }
            # the run writes its own ckpt/ at the end: resume from a copy
            rm -rf "$R/$name.init"
            cp -r "$R/$from/ckpt" "$R/$name.init"
            env_args+=("DRAFT_INIT=$R/$name.init")
            ;;
        *=*) env_args+=("$a") ;;
        *) echo "retrain_drafter: '$a' in '$spec' is not KNOB=VALUE" >&2; exit 2 ;;
        esac
    done
    echo "=== retrain_drafter: run $name: ${env_args[*]}"
    env "${env_args[@]}" "$PY" tools/train/train_dflash.py "$R/$name" >"$R/$name/log.txt" 2>&1 &
    pids+=($!)
    names+=("$name")
done

rc=0
for i in "${!pids[@]}"; do
    n=${names[$i]}
    if wait "${pids[$i]}"; then echo "=== $n ok"; else echo "=== $n FAILED"; rc=1; fi
    grep -E "train_dflash: (drafter|resumed|started|[0-9]+ steps|heldout|outside)" "$R/$n/log.txt" | sed "s/^/  $n: /" || true
    tar -C "$R" -cf - "$n" | split -b 15M - "$OUT/$n.tar."
done
ls -l "$OUT"
exit $rc
