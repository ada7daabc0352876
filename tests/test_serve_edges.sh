#!/usr/bin/env bash
# test_serve_edges.sh — `lily serve` and `lily run` where llama.cpp / Ollama / vLLM users trip: --host
# localhost on both loopbacks, a tool call cut inside its name by max_tokens, the request log's ttft of a
# forced reply and 499 for a stream its client left, seeds (-1 random, said; --seed the server's default)
# (tests/test_serve_edges.py); `lily run --seed -1` here.
# usage: bash tests/test_serve_edges.sh <path-to-lily> <tests/data>
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/lib/common.sh"
lily_test_init "$1" "$2"
M="$DATA/tiny-chat"

# run --seed -1: a random seed, printed; that seed draws the same reply again
"$LILY" run -m "$M" -p "Write a haiku." -n 16 --temp 1.2 --seed -1 >"$TMP/r1" 2>"$TMP/r1.err"; rc=$?
seed=$(sed -n 's/^lily run: --seed -1: sampling with seed \([0-9]*\)$/\1/p' "$TMP/r1.err")
expect "run --seed -1 runs and prints the seed it drew ($seed)" test "$rc" = 0 -a -n "$seed"
"$LILY" run -m "$M" -p "Write a haiku." -n 16 --temp 1.2 --seed "${seed:-0}" >"$TMP/r2" 2>/dev/null || true
expect "run --seed <that seed> draws the same reply" cmp -s "$TMP/r1" "$TMP/r2"
"$LILY" run -m "$M" -p "Write a haiku." -n 16 --temp 1.2 --seed -1 >"$TMP/r3" 2>"$TMP/r3.err" || true
seed3=$(sed -n 's/^lily run: --seed -1: sampling with seed \([0-9]*\)$/\1/p' "$TMP/r3.err")
expect "run --seed -1 twice: two seeds" test -n "$seed3" -a "$seed3" != "$seed"
for bad in -2 -10 x; do
    rc=0; "$LILY" run -m "$M" -p hi -n 1 --seed=$bad >/dev/null 2>"$TMP/bad.err" || rc=$?
    expect "run --seed $bad is a usage error naming -1" grep -qF \
        "lily run: --seed expects a non-negative integer, or -1 for a random seed, got \"$bad\"" "$TMP/bad.err"
    expect "... exit 2" test "$rc" = 2
done
rc=0; "$LILY" run --help >"$TMP/help" 2>&1 || rc=$?
expect "run --help documents --seed -1" grep -qF -- "--seed S           sampler seed (default or -1: a random one" "$TMP/help"
"$LILY" serve --help >"$TMP/shelp" 2>&1 || true
expect "serve --help documents --seed -1" grep -qF -- "--seed S             sampler seed (default -1: a random one per request" "$TMP/shelp"

# --host with a port or a scheme, or empty: a usage error saying what to write (it was "cannot resolve host")
hostcheck() { # name, --host value, message
    rc=0; "$LILY" serve -m "$DATA/nope" --port 0 --host "$2" >/dev/null 2>"$TMP/host.err" || rc=$?
    expect "$1" grep -qF -- "$3" "$TMP/host.err"
    expect "... exit 2" test "$rc" = 2
}
hostcheck "serve --host ADDR:PORT names --port" 0.0.0.0:8080 \
    "lily serve: --host takes an address without a port: got '0.0.0.0:8080'; give the port with --port (--host 0.0.0.0 --port 8080)"
hostcheck "serve --host URL says it takes an address" http://127.0.0.1:8080 \
    "lily serve: --host takes an address, not a URL: got 'http://127.0.0.1:8080'"
hostcheck "serve --host '' is empty" "" "lily serve: --host is empty"
rc=0; timeout 20 "$LILY" serve -m "$DATA/nope" --port 0 --host "::1" >/dev/null 2>"$TMP/host.err" || rc=$?
expect "serve --host ::1 is an address, not ADDR:PORT" bash -c "! grep -q 'without a port' '$TMP/host.err'"

lily_python "$LILY"

# --host localhost where the machine has no IPv6 loopback (a network namespace with IPv6 off on lo, when this
# user may make one): 127.0.0.1 alone, said at startup, no error
nov6() {
    ip link set lo up 2>/dev/null || true
    echo 1 >/proc/sys/net/ipv6/conf/lo/disable_ipv6 2>/dev/null || true
    if "$PY" -c 'import socket; socket.socket(socket.AF_INET6).bind(("::1", 0))' 2>/dev/null; then
        echo "skip"; return
    fi
    "$LILY" serve -m "$M" --host localhost --port 0 --threads 1 --ctx-size 256 2>"$TMP/nov6.log" & local pid=$!
    local port="" _
    for _ in $(seq 1 300); do
        port=$(sed -n 's/.*ready on http:\/\/localhost:\([0-9]*\).*/\1/p' "$TMP/nov6.log")
        [ -n "$port" ] && break
        sleep 0.1
    done
    if [ -n "$port" ] && exec 3<>"/dev/tcp/127.0.0.1/$port"; then
        printf 'GET /health HTTP/1.0\r\n\r\n' >&3
        head -1 <&3 | tr -d '\r'
        exec 3<&-
    fi
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
}
if unshare -n true 2>/dev/null; then
    export -f nov6; export LILY M TMP PY
    got=$(timeout 60 unshare -n bash -c nov6 2>/dev/null || true)
    if [ "$got" = skip ]; then
        echo "SKIP --host localhost without IPv6: cannot turn ::1 off in a network namespace here"
    else
        expect "--host localhost without an IPv6 loopback: 127.0.0.1 answers ($got)" test "${got#HTTP/1.? }" = "200 OK"
        expect "... and the startup line says 127.0.0.1 only" \
            grep -qF "(127.0.0.1 only: this machine has no IPv6 loopback)" "$TMP/nov6.log"
    fi
else
    echo "SKIP --host localhost without IPv6: no network namespaces here (unshare -n)"
fi

if "$PY" "$HERE/test_serve_edges.py" "$LILY" "$M"; then ok "serve edges (test_serve_edges.py)"; else fail "serve edges (test_serve_edges.py)"; fi
finish
