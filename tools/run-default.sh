#!/usr/bin/env bash
# run-default.sh (`make run`): the main job on the embedded pair. Generates a
# continuation of a Python snippet with the DFlash drafter (text streamed,
# statistics after it), then the same prompt with plain decoding, so the two
# outputs (identical: greedy speculative decoding is lossless) and their
# speeds can be compared.
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
echo "== dflash generate: Qwen3 target + DFlash drafter (block 16), greedy, CPU"
"$B/dflash" generate "${common[@]}" -d models/qwen3-pystd-dflash >"$B/run-dflash.txt" 2>"$B/run-dflash.err"
cat "$B/run-dflash.txt" "$B/run-dflash.err"
echo
echo "== the same prompt with plain decoding (no drafter)"
"$B/dflash" generate "${common[@]}" >"$B/run-plain.txt" 2>"$B/run-plain.err"
cat "$B/run-plain.err"
if cmp -s "$B/run-dflash.txt" "$B/run-plain.txt"; then
    echo "(output identical to the speculative run above, as it must be)"
else
    echo "OUTPUTS DIFFER:"; diff "$B/run-dflash.txt" "$B/run-plain.txt"; exit 1
fi
