#!/usr/bin/env bash
# bench-cpu.sh: CPU tokens/s of the embedded pair with and without the
# drafter. For each of the first N held-out prompts (tests/data/pystd) it
# runs `dflash generate --json` R times per mode and reports the median
# decode tokens/s (generated tokens / (total - prefill) time, as the CLI
# measures it) and tau. Usage: tools/bench-cpu.sh [N_PROMPTS] [RUNS] [N_NEW]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-6} R=${2:-5} NEW=${3:-128}
make -s build/dflash
bin=build/dflash m=models/qwen3-pystd d=models/qwen3-pystd-dflash
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 - "$N" "$tmp" <<'PY'
import json, sys
n, tmp = int(sys.argv[1]), sys.argv[2]
for i, p in enumerate(json.load(open("tests/data/pystd/heldout_prompts.json"))["prompts"][:n]):
    open(f"{tmp}/p{i}.txt", "w").write(p["text"])
PY
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
printf '%-8s %12s %12s %8s\n' prompt "plain tok/s" "dflash tok/s" tau
for ((i = 0; i < N; i++)); do
    ids=$($bin tokenize --tokenizer $m - <"$tmp/p$i.txt" | tr ' ' ',')
    for mode in plain dflash; do
        : >"$tmp/$mode"
        for ((r = 0; r < R; r++)); do
            if [ $mode = plain ]; then args=(); else args=(-d $d); fi
            $bin generate -m $m "${args[@]}" --prompt-ids "$ids" -n "$NEW" --json |
                python3 -c 'import json,sys; s=json.load(sys.stdin)["stats"]; print(s["tokens_per_s"], s["mean_accept"])' >>"$tmp/$mode"
        done
    done
    printf '%-8s %12s %12s %8s\n' "p$i" "$(cut -d' ' -f1 "$tmp/plain" | median)" \
        "$(cut -d' ' -f1 "$tmp/dflash" | median)" "$(cut -d' ' -f2 "$tmp/dflash" | head -1)"
done
