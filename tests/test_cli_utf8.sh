#!/usr/bin/env bash
# test_cli_utf8.sh — text that is not valid UTF-8 on the command line or on chat's stdin is refused with a
# message naming it and the byte offset, never reported as "out of memory", and chat goes on:
#   - run -p (chat template and --raw) and --system (run, chat): exit 2, "... is not valid UTF-8 (byte N of M)";
#   - chat: an invalid line (stray byte, UTF-8-encoded surrogate, overlong form) is skipped with that message,
#     the turns before and after it run, and the second valid turn reuses the first one's prompt;
#   - valid non-ASCII text (2-, 3- and 4-byte characters) still runs.
# usage: bash test_cli_utf8.sh <path-to-lily> <tests/data dir>
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
lily_test_init "$@"
M="$DATA/tiny-chat"
refused() { # name, expected exit status, expected message (fixed string), lily args...
    local name=$1 want_rc=$2 msg=$3; shift 3
    "$LILY" "$@" >"$TMP/out" 2>"$TMP/err" </dev/null; local rc=$?
    if [ "$rc" = "$want_rc" ] && grep -qF -- "$msg" "$TMP/err" && ! grep -q "out of memory" "$TMP/err"; then
        ok "$name"
    else
        fail "$name (exit $rc, stderr: $(head -c 300 "$TMP/err"))"
    fi
}

refused "run: invalid prompt (chat template)" 2 "lily run: the prompt is not valid UTF-8 (byte 2 of 5)" \
    run -m "$M" -p $'ab\xff\xfec' -n 2
refused "run --raw: invalid prompt" 2 "lily run: the prompt is not valid UTF-8 (byte 0 of 3)" \
    run -m "$M" --raw -p $'\xed\xa0\x80' -n 2
refused "run: invalid --system" 2 "lily run: --system is not valid UTF-8 (byte 1 of 3)" \
    run -m "$M" -p hi --system $'a\xffb' -n 2
refused "chat: invalid --system" 2 "lily chat: --system is not valid UTF-8 (byte 0 of 4)" \
    chat -m "$M" --system $'\xf4\x90\x80\x80' -n 2

printf 'hello\n\xff\xfe bad\n\xed\xa0\x80\n\xc0\xaf\nstill here?\n' |
    "$LILY" chat -m "$M" -n 3 --temp 0 >"$TMP/chat.out" 2>"$TMP/chat.err"; rc=$?
expect "chat: exits 0 after invalid lines" [ "$rc" = 0 ]
expect "chat: no 'out of memory'" bash -c "! grep -q 'out of memory' '$TMP/chat.err'"
expect "chat: each invalid line is named with its offset" bash -c "
    [ \"\$(grep -c 'lily chat: the message is not valid UTF-8 (byte 0 of [0-9]*)' '$TMP/chat.err')\" = 3 ]"
expect "chat: both valid turns ran, the second reusing the first's prompt" bash -c "
    grep -q '^\[turn 1: ' '$TMP/chat.err' && grep -Eq '^\[turn 2: prompt [0-9]+ tokens: [1-9][0-9]* reused \((session|checkpoint)\)' '$TMP/chat.err'"

"$LILY" run -m "$M" -p 'héllo ✓ 😀' --system 'ß' -n 2 --temp 0 >/dev/null 2>"$TMP/ok.err"; rc=$?
expect "run: valid non-ASCII prompt and --system run" [ "$rc" = 0 ]

finish
