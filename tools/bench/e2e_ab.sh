#!/usr/bin/env bash
# e2e_ab.sh: end-to-end tokens/s of the embedded pair through `dflash
# generate`, the same binary without and with some environment variables
# (a lever), alternated round by round so that drift hits both sides
# alike. Per round and side: the first 4 held-out prompts one at a time
# (speculative at WIDTH, 16 or auto, 256 new tokens each: decode tokens/s
# after the prefill, as `generate` prints it) and all 24 stepped together
# (`--batch`, 128 new tokens each, block 16: generated tokens/s over the
# whole batch). Prints every run, then the median of each column per side.
#
#   B=build ROUNDS=5 DEVICE=cuda WIDTH=auto bash tools/bench/e2e_ab.sh "DFLASH_HOST_DRAFTS=1"
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${B:-build}
ROUNDS=${ROUNDS:-5}
DEVICE=${DEVICE:-cpu}
WIDTH=${WIDTH:-16}
ENVS=${1:?usage: e2e_ab.sh "VAR=VALUE ..."}
D="$B/dflash"
[ -x "$D" ] || { echo "e2e_ab: $D not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp" <<'EOF'
import json, sys
prompts = json.load(open("tests/data/pystd/heldout_prompts.json"))["prompts"]
with open(sys.argv[1] + "/batch.jsonl", "w") as f:
    for p in prompts:
        f.write(json.dumps({"prompt": p["text"]}) + "\n")
for i, p in enumerate(prompts[:4]):
    open("%s/p%d.txt" % (sys.argv[1], i), "w").write(p["text"])
EOF
common=(-m models/qwen3-pystd -d models/qwen3-pystd-dflash --device "$DEVICE")
# "[... R tokens/s; ...]" or "[batch: ... R generated tokens/s]" -> R
rate() { sed -n 's/.* \([0-9.]*\) \(generated \)\{0,1\}tokens\/s.*/\1/p' "$1" | head -1; }
printf '%-6s %-4s %12s %12s %12s %12s %12s\n' side round single0 single1 single2 single3 batch24
for r in $(seq 1 "$ROUNDS"); do
    for side in base lever; do
        envs=()
        [ $side = lever ] && read -ra envs <<<"$ENVS"
        row=()
        for i in 0 1 2 3; do
            env "${envs[@]}" "$D" generate "${common[@]}" --block-size "$WIDTH" -p "$(cat "$tmp/p$i.txt")" -n 256 \
                >/dev/null 2>"$tmp/err"
            row+=("$(rate "$tmp/err")")
        done
        env "${envs[@]}" "$D" generate "${common[@]}" --block-size 16 --batch "$tmp/batch.jsonl" -n 128 \
            >/dev/null 2>"$tmp/err"
        row+=("$(rate "$tmp/err")")
        printf '%-6s %-4s %12s %12s %12s %12s %12s\n' $side "$r" "${row[@]}" | tee -a "$tmp/all"
    done
done
echo "medians over $ROUNDS rounds (lever: $ENVS; single prompts at width $WIDTH)"
python3 - "$tmp/all" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
for side in ("base", "lever"):
    cols = [[float(r[c]) for r in rows if r[0] == side] for c in range(2, 7)]
    print("%-11s" % side + "".join(" %12.1f" % statistics.median(c) for c in cols))
EOF
