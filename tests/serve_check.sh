#!/usr/bin/env bash
# serve_check.sh: `dflash serve` on the embedded pair (CPU), driven by the
# official openai npm client (tests/serve_client.mjs, installed here at a
# pinned version into $B/npm-openai). Starts four servers (one with an API
# key and a 64 KiB body limit, one with one session and no queue, one
# whose requests share 6 KV pages, one with one session, no queue and a
# 1 s client timeout), runs the client, then sends SIGTERM to each and
# checks they exit 0.
# DFLASH_BIN (default $B/dflash) picks the CLI; DFLASH_BIN_ASAN=1 says it is
# the sanitizer build (its exit status then also reports leaks).
# Prints the client's lines and a RESULT line (tests/run.sh adds it up).
set -u
B=${B:-build}
DFLASH=${DFLASH_BIN:-$B/dflash}
OPENAI_VERSION=7.59.0
cd "$(dirname "$0")/.."
pass=0 fail=0
result() { echo "RESULT $pass $fail"; }
note() { if [ "$1" = ok ]; then pass=$((pass + 1)); echo "ok $2"; else fail=$((fail + 1)); echo "FAIL $2"; fi; }
if [ ! -f "$B/npm-openai/node_modules/openai/package.json" ] ||
    ! grep -q "\"version\": \"$OPENAI_VERSION\"" "$B/npm-openai/node_modules/openai/package.json"; then
    npm install --prefix "$B/npm-openai" --no-audit --no-fund --no-save --loglevel=error "openai@$OPENAI_VERSION" ||
        { note fail "npm install openai@$OPENAI_VERSION"; result; exit 1; }
fi
M=models/qwen3-pystd D=models/qwen3-pystd-dflash
PROMPT='def read_config(path):'
EXPECT=$(mktemp) EXPECT_PEN=$(mktemp)
LOG1=$(mktemp) LOG2=$(mktemp) LOG3=$(mktemp) LOG4=$(mktemp)
trap 'rm -f "$EXPECT" "$EXPECT_PEN" "$LOG1" "$LOG2" "$LOG3" "$LOG4"; kill $P1 $P2 $P3 $P4 2>/dev/null' EXIT
"$DFLASH" generate -m $M -d $D -p "$PROMPT" -n 32 --json 2>/dev/null |
    node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(JSON.parse(s).text))' \
        >"$EXPECT" ||
    { note fail "dflash generate for the expected text"; result; exit 1; }
"$DFLASH" generate -m $M -d $D -p "$PROMPT" -n 32 --frequency-penalty 1.5 --presence-penalty 0.5 --json 2>/dev/null |
    node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(JSON.parse(s).text))' \
        >"$EXPECT_PEN" ||
    { note fail "dflash generate for the expected text with penalties"; result; exit 1; }
# Free ports: let the kernel pick, then hand them to the servers.
read -r PORT1 PORT2 PORT3 PORT4 < <(node -e 'const net=require("net");const s=[0,1,2,3].map(()=>net.createServer());
s[0].listen(0,"127.0.0.1",()=>s[1].listen(0,"127.0.0.1",()=>s[2].listen(0,"127.0.0.1",()=>
s[3].listen(0,"127.0.0.1",()=>{console.log(s.map(x=>x.address().port).join(" "));s.forEach(x=>x.close());}))))')
"$DFLASH" serve -m $M -d $D --port "$PORT1" --api-key test-key --max-body-bytes 65536 --max-sessions 16 \
    >"$LOG1" 2>&1 &
P1=$!
"$DFLASH" serve -m $M -d $D --port "$PORT2" --max-sessions 1 --max-queue 0 >"$LOG2" 2>&1 &
P2=$!
"$DFLASH" serve -m $M -d $D --port "$PORT3" --max-sessions 4 --kv-pages 6 >"$LOG3" 2>&1 &
P3=$!
"$DFLASH" serve -m $M -d $D --port "$PORT4" --max-sessions 1 --max-queue 0 --client-timeout 1 >"$LOG4" 2>&1 &
P4=$!
up() { node -e 'fetch(process.argv[1]).then(r=>process.exit(r.ok?0:1),()=>process.exit(1))' \
    "http://127.0.0.1:$1/health" 2>/dev/null; }
for _ in $(seq 1 300); do up "$PORT1" && up "$PORT2" && up "$PORT3" && up "$PORT4" && break; sleep 0.1; done
if ! up "$PORT1" || ! up "$PORT2" || ! up "$PORT3" || ! up "$PORT4"; then
    note fail "servers up"; cat "$LOG1" "$LOG2" "$LOG3" "$LOG4"; result; exit 1
fi
NPM_DIR=$PWD/$B/npm-openai BASE=http://127.0.0.1:$PORT1 BASE_SMALL=http://127.0.0.1:$PORT2 \
    BASE_KV=http://127.0.0.1:$PORT3 BASE_IDLE=http://127.0.0.1:$PORT4 EXPECT=$EXPECT EXPECT_PEN=$EXPECT_PEN \
    PROMPT=$PROMPT SERVER_PID=$P1 RSS_CHECK=$([ -n "${DFLASH_BIN_ASAN:-}" ] && echo 0 || echo 1) \
    node tests/serve_client.mjs >"$EXPECT.out" 2>&1
cat "$EXPECT.out"
read -r _ p f < <(grep '^RESULT ' "$EXPECT.out" | tail -n 1 || echo "RESULT 0 1")
pass=$((pass + ${p:-0})) fail=$((fail + ${f:-1}))
rm -f "$EXPECT.out"
for pid in $P1 $P2 $P3 $P4; do
    kill -TERM "$pid"
    for _ in $(seq 1 350); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        note fail "SIGTERM: server $pid still running after 35 s"
    else
        wait "$pid"
        rc=$?
        [ $rc = 0 ] && note ok "SIGTERM: server exits 0" || note fail "SIGTERM: server exit status $rc"
    fi
done
# the servers' own complaints (a client that left mid-stream is expected once)
grep -iE 'error|sanitizer' "$LOG1" "$LOG2" "$LOG3" "$LOG4" | grep -vE 'socket is no longer available|forcibly closed by remote peer' | head -n 20
result
[ "$fail" = 0 ]
