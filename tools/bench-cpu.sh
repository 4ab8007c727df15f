#!/usr/bin/env bash
# bench-cpu.sh: CPU speed of the embedded pair, speculative against plain.
#
# For each of the first N held-out prompts (tests/data/pystd, text the
# models never saw) it runs `dflash generate --json` R times in each mode,
# the modes alternating within every repetition so machine noise falls on
# all of them alike: plain (no drafter), auto (the drafter with the
# cost-aware width, the default) and fixed (the drafter, every step the
# full block of 16). Per prompt: the median decode tokens/s of each mode
# (generated tokens / (total - prefill) time, as the CLI measures it), the
# ratio auto/plain, tau, and the widths auto chose; every output must equal
# plain's. Then the summary: median and minimum of the per-prompt ratios.
# Last, `dflash bench --preset pystd` times the target's verify of
# 1, 2, 4 and 16 rows against a 1-row decode on random weights of the
# same geometry (median of 40 calls), the costs the width trades off.
#
# Usage: tools/bench-cpu.sh [N_PROMPTS (24)] [RUNS (5)] [N_NEW (128)]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-24} R=${2:-5} NEW=${3:-128}
make -s build/dflash
bin=build/dflash m=models/qwen3-pystd d=models/qwen3-pystd-dflash
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 - "$N" "$tmp" <<'PY'
import json, sys
n, tmp = int(sys.argv[1]), sys.argv[2]
for i, p in enumerate(json.load(open("tests/data/pystd/heldout_prompts.json"))["prompts"][:n]):
    open(f"{tmp}/p{i}.txt", "w").write(p["text"])
PY
N=$(ls "$tmp"/p*.txt | wc -l)
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1); $N prompts x $R runs per mode, $NEW new tokens"
run() { # mode ids -> one JSON line {tps, tau, widths, out}
    local mode=$1 ids=$2 args=()
    case $mode in
    auto) args=(-d $d) ;;
    fixed) args=(-d $d --block-size 16) ;;
    esac
    $bin generate -m $m "${args[@]}" --prompt-ids "$ids" -n "$NEW" --ignore-eos --json
}
for ((i = 0; i < N; i++)); do
    ids=$($bin tokenize --tokenizer $m - <"$tmp/p$i.txt" | tr ' ' ',')
    for ((r = 0; r < R; r++)); do
        for mode in plain auto fixed; do
            run $mode "$ids" >>"$tmp/r$i.$mode"
        done
    done
done
python3 - "$tmp" "$N" <<'PY'
import json, statistics, sys
tmp, n = sys.argv[1], int(sys.argv[2])
ratios, bad = [], 0
print(f"{'prompt':<7} {'plain tok/s':>11} {'auto tok/s':>10} {'fixed tok/s':>11} {'auto/plain':>10} {'tau auto':>8} {'tau 16':>6}  auto widths (steps)")
for i in range(n):
    runs = {m: [json.loads(l) for l in open(f"{tmp}/r{i}.{m}")] for m in ("plain", "auto", "fixed")}
    med = {m: statistics.median(r["stats"]["tokens_per_s"] for r in runs[m]) for m in runs}
    ref = runs["plain"][0]["output_ids"]
    for m in runs:
        for r in runs[m]:
            if r["output_ids"] != ref:
                bad += 1
    ratio = med["auto"] / med["plain"]
    ratios.append(ratio)
    hist = runs["auto"][0]["stats"]["drafts_per_step_hist"]
    widths = " ".join(f"{k}:{c}" for k, c in enumerate(hist) if c)
    print(f"p{i:<6} {med['plain']:11.1f} {med['auto']:10.1f} {med['fixed']:11.1f} {ratio:10.2f} "
          f"{runs['auto'][0]['stats']['mean_accept']:8.2f} {runs['fixed'][0]['stats']['mean_accept']:6.2f}  {widths}")
print(f"auto/plain tokens/s: median {statistics.median(ratios):.2f}, min {min(ratios):.2f}, max {max(ratios):.2f}"
      f" over {n} prompts; outputs differing from plain: {bad}")
sys.exit(1 if bad else 0)
PY
echo
echo "target costs at the embedded geometry (random weights; median of 40 calls after 3 warm-up):"
$bin bench --preset pystd --ctx 1,256 --rows 1,2,4,16 --reps 40 | grep -E '^(op|verify|decode)'
