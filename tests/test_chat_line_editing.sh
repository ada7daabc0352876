#!/usr/bin/env bash
# test_chat_line_editing.sh — `lily chat` at a terminal (a pseudo-terminal, TERM=xterm): libedit edits the
# line and keeps the history, and messages can span lines. Typed: "abc", Left, "X", Enter -> "abXc" (the
# escape sequence never reaches the model); Up, Enter -> "abXc" again (history); "one\" Enter "two" Enter ->
# "one\ntwo"; a """ block of two lines -> "first line\nsecond line". /save writes the conversation, whose
# user messages must be exactly those, and a /save that fails says why. Without a TTY the same multi-line rules hold (piped stdin).
# Slash commands with a bad argument say what they take; //text sends "/text"; a line with a NUL byte is refused.
# Skips where the build has no libedit (the chat then reads plain lines).
# usage: bash test_chat_line_editing.sh <path-to-lily> <tests/data dir>
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
lily_test_init "$@"
lily_python "$LILY"
M="$DATA/tiny-chat"

printf 'one\\\ntwo\n"""\nfirst line\nsecond line\n"""\n/save %s\n/quit\n' "$TMP/piped.json" |
    "$LILY" chat -m "$M" -n 2 --temp 0 >/dev/null 2>&1
expect "piped: a trailing backslash and a \"\"\" block make multi-line messages" "$PY" -c "
import json, sys
msgs = [m['content'] for m in json.load(open('$TMP/piped.json')) if m['role'] == 'user']
sys.exit(0 if msgs == ['one\ntwo', 'first line\nsecond line'] else 1)"

# a /save that cannot write says why (the system's reason), and the chat goes on
printf 'hi\n/save %s\n/quit\n' "$TMP/no-such-dir/c.json" |
    "$LILY" chat -m "$M" -n 2 --temp 0 2>"$TMP/save.err" >/dev/null
expect "/save into a missing directory: 'cannot write FILE: No such file or directory'" \
    grep -qF "[cannot write $TMP/no-such-dir/c.json: No such file or directory]" "$TMP/save.err"
# slash commands with a bad argument say what they take (they said "unknown command"); //text sends "/text";
# a line holding a NUL byte is refused, not cut there and merged with the next line
# a command with blanks after it is that command ("/think off " was "/think takes on or off, not 'off '", and
# "/quit " an unknown command that left the chat running)
printf '/think off \t\n/quit \nnot sent\n' | "$LILY" chat -m "$M" -n 2 --temp 0 2>"$TMP/blanks.err" >/dev/null
expect "commands with trailing blanks: /think off acknowledged, /quit quits" \
    bash -c "grep -qxF '[thinking off]' '$TMP/blanks.err' && ! grep -q '^\[turn ' '$TMP/blanks.err'"
# /save ~/FILE writes under $HOME, as a shell would read it (the chat line is no shell: it failed with "No such
# file or directory"); ~user and a ~ inside the name stay as written
mkdir -p "$TMP/home"
printf 'hi\n/save ~/tilde.json\n/quit\n' | HOME="$TMP/home" "$LILY" chat -m "$M" -n 2 --temp 0 2>"$TMP/tilde.err" >/dev/null
expect "/save ~/FILE writes \$HOME/FILE and says so" \
    bash -c "[ -s '$TMP/home/tilde.json' ] && grep -qxF '[conversation saved to $TMP/home/tilde.json]' '$TMP/tilde.err'"
printf '/save\n/think maybe\n/usr/bin is slow\n//usr/bin is slow\na\0b\nnext\n/save %s\n/quit\n' "$TMP/slash.json" |
    "$LILY" chat -m "$M" -n 2 --temp 0 2>"$TMP/slash.err" >/dev/null
expect "/save without a file says it needs one" grep -qxF "/save needs a file name: /save FILE" "$TMP/slash.err"
expect "/think maybe says /think takes on or off" grep -qxF "/think takes on or off, not 'maybe'" "$TMP/slash.err"
expect "an unknown /command says how to send a message that starts with /" \
    grep -qF "unknown command /usr/bin is slow (/help lists them; //usr/bin is slow sends a message" "$TMP/slash.err"
expect "a NUL byte in a line: the message is refused, saying why" \
    grep -qF "lily chat: the message holds a NUL byte: not text (not sent)" "$TMP/slash.err"
expect "//text is sent as /text, and the line after the NUL one as itself" "$PY" -c "
import json, sys
msgs = [m['content'] for m in json.load(open('$TMP/slash.json')) if m['role'] == 'user']
sys.exit(0 if msgs == ['/usr/bin is slow', 'next'] else 1)"
if ! ldd "$LILY" | grep -q libedit; then
    echo "SKIP the terminal checks: this lily was built without libedit (make deps installs libedit-dev)"
    finish
    exit $?
fi
set +e
"$PY" - "$LILY" "$M" "$TMP/tty.json" <<'PY'
import json, os, pty, select, sys, time
lily, model, saved = sys.argv[1:4]
pid, fd = pty.fork()
if pid == 0:
    os.environ["TERM"] = "xterm"
    os.execv(lily, [lily, "chat", "-m", model, "-n", "2", "--temp", "0"])
out = b""
def read_until(marker, timeout=60):
    global out
    deadline = time.time() + timeout
    while time.time() < deadline:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
            if marker in out:
                i = out.index(marker) + len(marker)
                out = out[i:]
                return True
    sys.stderr.write("timed out waiting for %r; got %r\n" % (marker, out[-400:]))
    return False
def send(keys, then=b"> "):
    os.write(fd, keys)
    return read_until(then)
ok = read_until(b"> ")
ok = ok and send(b"abc\x1b[DX\r")            # Left arrow, then X: abXc
ok = ok and send(b"\x1b[A\r")                # Up arrow recalls abXc
ok = ok and send(b"one\\\r", b"... ") and send(b"two\r")
ok = ok and send(b'"""\r', b"... ") and send(b"first line\r", b"... ") and send(b"second line\r", b"... ") \
    and send(b'"""\r')
ok = ok and send(b"/save " + saved.encode() + b"\r")
os.write(fd, b"/quit\r")
_, status = os.waitpid(pid, 0)
msgs = [m["content"] for m in json.load(open(saved)) if m["role"] == "user"] if ok else None
want = ["abXc", "abXc", "one\ntwo", "first line\nsecond line"]
print("user messages:", msgs)
sys.exit(0 if ok and msgs == want and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else 1)
PY
rc=$?
set -e
expect "terminal: arrow-key editing, history recall, backslash and \"\"\" multi-line messages" [ $rc = 0 ]
finish
