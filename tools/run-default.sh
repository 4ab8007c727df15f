#!/usr/bin/env bash
# run-default.sh (`make run`): the main job on the embedded pair. Generates a
# continuation of a Python snippet with the DFlash drafter (text streamed,
# statistics after it; the block width chosen per step from measured costs),
# then the same prompt with plain decoding, and prints both speeds side by
# side with a check that the outputs are identical (greedy speculative
# decoding is lossless).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
prompt='import os


def walk_files(root, suffix=".py"):
    """Yield the paths of files under root that end with suffix."""
'
common=(-m models/qwen3-pystd -p "$prompt" -n 160)
echo "== prompt"
printf '%s' "$prompt"
echo
echo "== dflash generate: Qwen3 target + DFlash drafter (block up to 16, width auto), greedy, CPU"
"$B/dflash" generate "${common[@]}" -d models/qwen3-pystd-dflash >"$B/run-dflash.txt" 2>"$B/run-dflash.err"
cat "$B/run-dflash.txt" "$B/run-dflash.err"
echo
echo "== the same prompt with plain decoding (no drafter)"
"$B/dflash" generate "${common[@]}" >"$B/run-plain.txt" 2>"$B/run-plain.err"
cat "$B/run-plain.err"
same=1
cmp -s "$B/run-dflash.txt" "$B/run-plain.txt" || same=0
# "[... in S steps; tau T tokens/step; R tokens/s; ...]" -> "S T R"
nums() { sed -n 's/.* in \([0-9]*\) steps; tau \([0-9.]*\) tokens\/step; \([0-9.]*\) tokens\/s;.*/\1 \2 \3/p' "$1" | head -1; }
read -r s1 t1 r1 <<<"$(nums "$B/run-dflash.err")"
read -r s2 t2 r2 <<<"$(nums "$B/run-plain.err")"
echo
echo "== side by side (decode tokens/s: generated tokens / time after the prefill)"
printf '%-28s %10s %7s %6s\n' "" "tokens/s" "steps" "tau"
printf '%-28s %10s %7s %6s\n' "DFlash drafter, width auto" "$r1" "$s1" "$t1"
printf '%-28s %10s %7s %6s\n' "plain decoding" "$r2" "$s2" "$t2"
awk -v a="$r1" -v b="$r2" 'BEGIN { if (b > 0) printf "speculative / plain: %.2fx\n", a / b }'
if [ $same = 1 ]; then
    echo "outputs: identical, as they must be"
else
    echo "OUTPUTS DIFFER:"; diff "$B/run-dflash.txt" "$B/run-plain.txt"; exit 1
fi
