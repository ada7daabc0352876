#!/usr/bin/env bash
# test_cli_usage.sh — usage errors name what is wrong: `lily debug --help` (exit 0, the subcommands on
# stdout), `lily debug SUB` with an unknown SUB (exit 2, "unknown subcommand 'SUB'"), `lily info -m` without
# a value (exit 2, "-m needs a value"), and `lily debug tokenize` errors prefixed with the command's name.
# usage: bash test_cli_usage.sh <path-to-lily> <tests/data dir>
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
lily_test_init "$@"
check() { # name, expected exit status, file to grep (out|err), fixed string, lily args...
    local name=$1 want_rc=$2 where=$3 msg=$4; shift 4
    "$LILY" "$@" >"$TMP/out" 2>"$TMP/err" <"$TMP/stdin"; local rc=$?
    if [ "$rc" = "$want_rc" ] && grep -qF -- "$msg" "$TMP/$where"; then
        echo "ok   $name"; passes=$((passes + 1))
    else
        echo "FAIL $name (exit $rc; stdout: $(head -c 200 "$TMP/out"); stderr: $(head -c 200 "$TMP/err"))"
        fails=$((fails + 1))
    fi
}
: >"$TMP/stdin"
check "debug --help lists the subcommands on stdout" 0 out "  tokenize  the token ids of the text on stdin" debug --help
check "debug with an unknown subcommand names it" 2 err "lily debug: unknown subcommand 'bogus'" debug bogus
check "debug without a subcommand prints the usage" 2 err "usage: lily debug tokenize|render|parse" debug
check "info -m without a value says so" 2 err "lily info: -m needs a value" info -m
printf '\xff' >"$TMP/stdin"
check "debug tokenize errors carry the command's name" 1 err \
    "lily debug tokenize: text is not valid UTF-8 (byte 0 of 1)" debug tokenize --model "$DATA/tiny-chat"
finish
