#!/usr/bin/env bash
# test_ctx_size_warning.sh — a --ctx-size past the model's max_position_embeddings is used, with one warning
# line on stderr at start-up (as llama.cpp warns for n_ctx > n_ctx_train), in run, chat and serve (serve had
# none); a --ctx-size up to it gives none. Models: tiny-chat with max_position_embeddings set to 600 (a
# fixture made here), and the bundled models/lily-tiny (8192).
# usage: bash test_ctx_size_warning.sh <path-to-lily> <tests/data dir>
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
lily_test_init "$@"
SHORT="$TMP/short"
mkdir "$SHORT"
for f in "$DATA/tiny-chat"/*; do ln -s "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" "$SHORT/"; done
rm "$SHORT/config.json"
sed 's/"max_position_embeddings": [0-9]*/"max_position_embeddings": 600/' "$DATA/tiny-chat/config.json" >"$SHORT/config.json"
BUNDLED="$DATA/../../models/lily-tiny"

# check NAME ERR_FILE CMD CTX MAX: ok when the command succeeded ($rc 0, and what the caller adds in $extra)
# and ERR_FILE has the warning exactly once when CTX > MAX, else no warning at all
check() {
    local want=0 what="no warning"
    [ "$4" -gt "$5" ] && want=1 what="one warning"
    local line="lily $3: warning: --ctx-size $4 is beyond the model's max_position_embeddings $5; quality past that length is untested"
    local exact any
    exact=$(grep -cxF -- "$line" "$2")
    any=$(grep -c 'warning: --ctx-size' "$2")
    if [ "$rc" = 0 ] && [ "$exact" = "$want" ] && [ "$any" = "$want" ]; then
        ok "$1: $what"
    else
        fail "$1: $what (exit $rc; stderr: $(head -c 400 "$2"))"
    fi
}
run_warns() { # MODEL CTX MAX
    "$LILY" run -m "$1" --ctx-size "$2" -p hi -n 1 --temp 0 >/dev/null 2>"$TMP/run.err"; rc=$?
    check "run --ctx-size $2, max_position_embeddings $3" "$TMP/run.err" run "$2" "$3"
}
chat_warns() { # MODEL CTX MAX
    "$LILY" chat -m "$1" --ctx-size "$2" </dev/null >/dev/null 2>"$TMP/chat.err"; rc=$?
    check "chat --ctx-size $2, max_position_embeddings $3" "$TMP/chat.err" chat "$2" "$3"
}
serve_warns() { # MODEL CTX MAX: the warning comes with the model's loading; the server then serves
    : >"$TMP/serve.err" # emptied here: the child's redirection may come after the first grep below, which would
                        # then read the previous server's "ready on" line and port
    "$LILY" serve -m "$1" --port 0 --threads 1 --ctx-size "$2" >/dev/null 2>"$TMP/serve.err" &
    local pid=$! port="" health=""
    for _ in $(seq 600); do
        port=$(grep -o 'ready on http://127\.0\.0\.1:[0-9]*' "$TMP/serve.err" | grep -o '[0-9]*$')
        [ -n "$port" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$port" ] && health=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    rc=1
    [ "$health" = 200 ] && rc=0
    check "serve --ctx-size $2, max_position_embeddings $3: serves (GET /health $health)" "$TMP/serve.err" serve "$2" "$3"
}

run_warns "$SHORT" 700 600
run_warns "$SHORT" 600 600
chat_warns "$SHORT" 700 600
chat_warns "$SHORT" 600 600
serve_warns "$SHORT" 700 600
serve_warns "$SHORT" 600 600
run_warns "$BUNDLED" 8193 8192
if "$LILY" serve --help >/dev/null 2>&1; then # built with libmicrohttpd
    serve_warns "$BUNDLED" 8193 8192
    serve_warns "$BUNDLED" 8192 8192
fi
finish
