#!/usr/bin/env bash
# test_run_chat.sh — `lily run` and `lily chat` end to end on tests/data/tiny-chat (random weights, real
# tokenizer + template):
#   - run: same seed -> same output (greedy and sampled); speed line on stderr; the prompt ids equal
#     `debug render` + `debug tokenize` of the same request (thinking on, --no-think, --system); --raw
#     (with --system, --no-think or --hide-reasoning: exit 2);
#   - greedy run == the argmax of `lily eval` teacher-forced on prompt + reply (decode path, as run), and
#     the printed text == the reply's ids decoded independently (Python, byte-level);
#   - errors (exit 1 + message): bad path, missing / malformed tokenizer.json, tokenizer ids past the
#     model's vocab, prompt longer than --ctx-size;
#   - chat: turn 2 reuses turn 1's prompt and prefills only the new tokens; /think off; /reset; /quit;
#     Ctrl-C stops a reply and the REPL goes on; Ctrl-C at the prompt exits; $LILY_MODEL as the default.
# usage: bash test_run_chat.sh <path-to-lily> <tests/data dir>
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
lily_test_init "$@"
lily_python "$LILY"
M="$DATA/tiny-chat"

# --- run: determinism and the speed report ------------------------------------------------------------
"$LILY" run -m "$M" -p "Write a haiku." -n 24 --seed 7 --temp 0 >"$TMP/g1" 2>"$TMP/g1.err"; rc1=$?
"$LILY" run -m "$M" -p "Write a haiku." -n 24 --seed 99 --temp 0 >"$TMP/g2" 2>"$TMP/g2.err"; rc2=$?
expect "run exits 0" [ "$rc1" = 0 -a "$rc2" = 0 ]
expect "run greedy output is deterministic and non-empty" bash -c "cmp -s '$TMP/g1' '$TMP/g2' && [ -s '$TMP/g1' ]"
expect "run prints prefill and decode tok/s" grep -Eq '^prefill: [0-9]+ tokens, [0-9.]+ tok/s .*decode: [0-9]+ tokens, [0-9.]+ tok/s' "$TMP/g1.err"
"$LILY" run -m "$M" -p "Write a haiku." -n 24 --seed 7 --temp 0.9 >"$TMP/s1" 2>/dev/null
"$LILY" run -m "$M" -p "Write a haiku." -n 24 --seed 7 --temp 0.9 >"$TMP/s2" 2>/dev/null
"$LILY" run -m "$M" -p "Write a haiku." -n 24 --seed 8 --temp 0.9 >"$TMP/s3" 2>/dev/null
expect "run same seed, same sampled output" cmp -s "$TMP/s1" "$TMP/s2"
expect "run other seed, other sampled output" bash -c "! cmp -s '$TMP/s1' '$TMP/s3'"
expect "run stdout carries no stats" bash -c "! grep -q 'tok/s' '$TMP/g1'"
# --top-p 0 is greedy whatever the seed and temperature, as lily serve's top_p 0 (it was refused with "(0, 1]"
# while an out-of-range value was told "expects a number in [0, 1]")
"$LILY" run -m "$M" -p "Write a haiku." -n 24 --seed 7 --temp 0.9 --top-p 0 >"$TMP/p0a" 2>/dev/null; rc1=$?
"$LILY" run -m "$M" -p "Write a haiku." -n 24 --seed 8 --top-p 0 >"$TMP/p0b" 2>/dev/null; rc2=$?
expect "run --top-p 0 is the greedy reply (seeds 7 and 8, --temp 0.9 and the default)" \
    bash -c "[ $rc1 = 0 -a $rc2 = 0 ] && cmp -s '$TMP/p0a' '$TMP/g1' && cmp -s '$TMP/p0b' '$TMP/g1'"
expect "chat --top-p 0 is the greedy reply" bash -c "cmp -s <('$LILY' chat -m '$M' -n 12 --seed 5 --top-p 0 \
    <<<'Tell me about dogs.' 2>/dev/null) <('$LILY' run -m '$M' -p 'Tell me about dogs.' -n 12 --temp 0 2>/dev/null)"

# --- run: reasoning plain when piped, dropped by --hide-reasoning, ANSI faint on a terminal -----------
"$LILY" run -m "$M" -p "Write a haiku." -n 24 --temp 0 --hide-reasoning >"$TMP/hide" 2>/dev/null
expect "run --hide-reasoning prints only the content (a proper suffix)" "$PY" -c "
import sys; full = open('$TMP/g1', 'rb').read(); hid = open('$TMP/hide', 'rb').read()
sys.exit(0 if 0 < len(hid) < len(full) and full.endswith(b'\\n\\n' + hid) and b'\\033' not in full else 1)"
if script --version 2>/dev/null | grep -q util-linux; then # a pseudo-terminal for stdout
    script -qc "'$LILY' run -m '$M' -p 'Write a haiku.' -n 24 --temp 0 2>/dev/null" /dev/null >"$TMP/tty" </dev/null
    expect "run dims the reasoning on a terminal" "$PY" -c "
import sys; t = open('$TMP/tty', 'rb').read()
sys.exit(0 if t.startswith(b'\\033[2m') and b'\\033[0m' in t else 1)"
fi

# --- run: the prompt ids are the template's rendering, encoded ----------------------------------------
prompt_ids() { sed -n 's/^prompt ids: //p' "$1"; }
reply_ids() { sed -n 's/^generated ids: //p' "$1"; }
render_ids() { # request-json [render flags...]
    local req=$1; shift
    printf '%s' "$req" >"$TMP/req.json"
    "$LILY" debug render --request "$TMP/req.json" "$@" >"$TMP/rendered.txt" 2>/dev/null &&
        "$LILY" debug tokenize --model "$M" --ids <"$TMP/rendered.txt"
}
"$LILY" run -m "$M" -p "Write a haiku." -n 4 --temp 0 --show-ids >/dev/null 2>"$TMP/think.err"
want=$(render_ids '{"messages":[{"role":"user","content":"Write a haiku."}]}')
expect "run renders thinking on (prompt ends <think>\\n)" [ "$(prompt_ids "$TMP/think.err")" = "$want" -a -n "$want" ]
"$LILY" run -m "$M" -p "Write a haiku." -n 4 --temp 0 --no-think --show-ids >/dev/null 2>"$TMP/nothink.err"
want=$(render_ids '{"messages":[{"role":"user","content":"Write a haiku."}]}' --no-think)
expect "run --no-think renders an empty think block" [ "$(prompt_ids "$TMP/nothink.err")" = "$want" -a -n "$want" ]
"$LILY" run -m "$M" -p "Hi" --system "Be brief." -n 4 --temp 0 --show-ids >/dev/null 2>"$TMP/sys.err"
want=$(render_ids '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}')
expect "run --system adds a system message" [ "$(prompt_ids "$TMP/sys.err")" = "$want" -a -n "$want" ]
"$LILY" run -m "$M" --raw -p "def main():" -n 8 --temp 0 --show-ids >"$TMP/raw.out" 2>"$TMP/raw.err"; rc=$?
want=$(printf 'def main():' | "$LILY" debug tokenize --model "$M" --ids)
expect "run --raw encodes the prompt as is" [ "$rc" = 0 -a "$(prompt_ids "$TMP/raw.err")" = "$want" ]
# the chat template's options have nothing to act on under --raw: a usage error naming it, not dropped silently
for opt in "--system Hi" --no-think --hide-reasoning; do
    # shellcheck disable=SC2086
    "$LILY" run -m "$M" --raw -p "def main():" -n 2 $opt >/dev/null 2>"$TMP/rawopt.err"; rc=$?
    expect "run --raw $opt is a usage error naming it" \
        bash -c "[ $rc = 2 ] && grep -qF -- 'lily run: ${opt%% *} has no effect with --raw' '$TMP/rawopt.err'"
done

# --- greedy run == teacher-forced argmax of lily eval; text == decoded ids ------------------------------
printf '%s' '{"messages":[{"role":"user","content":"Name three colors."}]}' >"$TMP/req.json"
"$LILY" debug render --request "$TMP/req.json" >"$TMP/prompt.txt" 2>/dev/null
PR=$(cat "$TMP/prompt.txt"; printf x) # keep the prompt's trailing newline
"$LILY" run -m "$M" --raw -p "${PR%x}" -n 20 --temp 0 --show-ids >"$TMP/greedy.out" 2>"$TMP/greedy.err"
"$LILY" run -m "$M" -p "Name three colors." -n 20 --temp 0 --show-ids >/dev/null 2>"$TMP/greedy_chat.err"
P=$(prompt_ids "$TMP/greedy.err"); G=$(reply_ids "$TMP/greedy.err")
expect "raw rendered prompt == chat prompt (ids)" [ -n "$P" -a "$P" = "$(prompt_ids "$TMP/greedy_chat.err")" ]
expect "raw and chat greedy replies agree (ids)" [ -n "$G" -a "$G" = "$(reply_ids "$TMP/greedy_chat.err")" ]
np=$(wc -w <<<"$P")
"$LILY" eval -m "$M" --tokens "$P $G" --decode-from "$np" --logits-out "$TMP/tf.f32" >/dev/null 2>&1
finish=$(sed -n 's/.*| \([a-z]*\)$/\1/p' "$TMP/greedy.err")
if "$PY" - "$M" "$TMP/tf.f32" "$np" "$G" "$finish" "$TMP/greedy.out" <<'PY'
import json, struct, sys
model, logits_path, np_, gen, finish, out_path = sys.argv[1:]
np_ = int(np_)
gen = [int(x) for x in gen.split()]
vocab = json.load(open(model + "/config.json"))["text_config"]["vocab_size"]
raw = open(logits_path, "rb").read()
n = len(raw) // (4 * vocab)
assert n == np_ + len(gen), (n, np_, len(gen))
rows = [struct.unpack_from("<%df" % vocab, raw, 4 * vocab * i) for i in range(n)]
argmax = [max(range(vocab), key=lambda j: (r[j], -j)) for r in rows]
for k, t in enumerate(gen):
    assert argmax[np_ - 1 + k] == t, ("step", k, argmax[np_ - 1 + k], t)
if finish == "stop":  # the token after the reply is a stop id (<|endoftext|> 0 or <|im_end|> 2)
    assert argmax[-1] in (0, 2), argmax[-1]
# decode the ids independently: byte-level BPE, added tokens verbatim
tj = json.load(open(model + "/tokenizer.json"))
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs = bs[:]
k = 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + k); k += 1
byte_of = {chr(c): b for b, c in zip(bs, cs)}
pieces = {i: bytes(byte_of[ch] for ch in tok) for tok, i in tj["model"]["vocab"].items()}
for a in tj["added_tokens"]:
    pieces[a["id"]] = a["content"].encode()
text = b"".join(pieces[t] for t in gen).decode("utf-8", errors="replace")
if text and not text.endswith("\n"):
    text += "\n"
got = open(out_path, encoding="utf-8").read()
assert got == text, (got, text)
print("greedy: %d prompt + %d reply tokens, finish %s" % (np_, len(gen), finish))
PY
then ok "greedy run == eval argmax (teacher-forced), text == decoded ids"; else fail "greedy run vs eval"; fi

# --- errors ------------------------------------------------------------------------------------------
expect_error() { # name, expected-substring, command...
    local name=$1 want=$2; shift 2
    local out rc
    out=$("$@" 2>&1 >/dev/null); rc=$?
    if [ "$rc" = 1 ] && grep -qF -- "$want" <<<"$out"; then ok "$name: $(head -1 <<<"$out")"
    else fail "$name: rc $rc, stderr: $out"; fi
}
mkdir "$TMP/notok" "$TMP/badtok" "$TMP/bigtok"
for d in notok badtok bigtok; do cp "$M"/* "$TMP/$d/"; done
rm "$TMP/notok/tokenizer.json"
head -c 300 "$M/tokenizer.json" >"$TMP/badtok/tokenizer.json"
"$PY" - "$TMP/bigtok/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["added_tokens"][-1]["id"] = 600
json.dump(t, open(sys.argv[1], "w"), ensure_ascii=False)
PY
expect_error "bad model path" "$TMP/nope" "$LILY" run -m "$TMP/nope" -p hi
expect_error "missing tokenizer.json" "tokenizer.json" "$LILY" run -m "$TMP/notok" -p hi
expect_error "malformed tokenizer.json" "malformed" "$LILY" run -m "$TMP/badtok" -p hi
expect_error "tokenizer ids past the vocab" "vocab_size is 512" "$LILY" run -m "$TMP/bigtok" -p hi
expect_error "tokenizer ids past the vocab (names its size)" "601" "$LILY" run -m "$TMP/bigtok" -p hi
expect_error "prompt longer than the context" "prompt is 30 tokens, context is 16" "$LILY" run -m "$M" -p "hello world this is long" --ctx-size 16
# a prompt exactly as long as the context leaves no room for a reply: an error naming both, as lily serve's 400
# (it printed nothing and "decode: 0 tokens ... | length", exit 0); -n 0 (no cap) changes nothing; one token more
# of context gives a one-token reply
expect_error "a prompt that fills the context" \
    "lily run: prompt is 30 tokens, context is 30: no room for the reply (raise --ctx-size or shorten the prompt)" \
    "$LILY" run -m "$M" -p "hello world this is long" --ctx-size 30
expect_error "a prompt that fills the context, -n 0" "lily run: prompt is 30 tokens, context is 30: no room for the reply" \
    "$LILY" run -m "$M" -p "hello world this is long" --ctx-size 30 -n 0
"$LILY" run -m "$M" -p "hello world this is long" --ctx-size 31 --temp 0 >/dev/null 2>"$TMP/ctx31.err"; rc=$?
expect "a prompt one token short of the context: one token of reply, finish length" \
    bash -c "[ $rc = 0 ] && grep -qE '^prefill: 30 tokens.*decode: 1 tokens.*\| length' '$TMP/ctx31.err'"
printf 'hello world this is long\n' | "$LILY" chat -m "$M" --ctx-size 30 >"$TMP/chatfull.out" 2>"$TMP/chatfull.err"
expect "chat: a message that fills the context is refused, naming both" bash -c "grep -qF 'lily chat: prompt is 30 tokens, \
context is 30: no room for the reply (/reset to start over, or raise --ctx-size)' '$TMP/chatfull.err' && [ ! -s '$TMP/chatfull.out' ]"
expect_error "chat: bad model path" "$TMP/nope" "$LILY" chat -m "$TMP/nope"

# --- chat --------------------------------------------------------------------------------------------
turn_field() { # stderr-file turn field(prompt|reused|prefilled|how)
    local line
    line=$(grep "^\[turn $2:" "$1")
    case $3 in
    prompt) sed -n 's/.*prompt \([0-9]*\) tokens.*/\1/p' <<<"$line" ;;
    reused) sed -n 's/.*: \([0-9]*\) reused.*/\1/p' <<<"$line" ;;
    how) sed -n 's/.* reused (\([a-z]*\)).*/\1/p' <<<"$line" ;;
    prefilled) sed -n 's/.*, \([0-9]*\) prefilled.*/\1/p' <<<"$line" ;;
    esac
}
for n in 1 12; do # -n 1: the session holds exactly the prompt; -n 12: the reply re-encodes differently
    "$LILY" chat -m "$M" -n $n --seed 3 --temp 0 >"$TMP/chat$n.out" 2>"$TMP/chat$n.err" <<'EOF'
Tell me about dogs.
And cats?
/think off
What about birds?
/think on
/reset
Tell me about dogs.
/quit
Never sent.
EOF
    rc=$?
    expect "chat -n $n exits 0" [ "$rc" = 0 ]
    p1=$(turn_field "$TMP/chat$n.err" 1 prompt); p2=$(turn_field "$TMP/chat$n.err" 2 prompt)
    r2=$(turn_field "$TMP/chat$n.err" 2 reused); f2=$(turn_field "$TMP/chat$n.err" 2 prefilled)
    expect "chat -n $n turn 2 reuses turn 1's prompt ($r2 of $p2)" [ -n "$r2" -a "$r2" = "$p1" ]
    expect "chat -n $n turn 2 prefills only the new tokens ($f2)" [ -n "$f2" -a "$f2" = $((p2 - r2)) -a "$f2" -gt 0 ]
    p3=$(turn_field "$TMP/chat$n.err" 3 prompt); r3=$(turn_field "$TMP/chat$n.err" 3 reused)
    expect "chat -n $n /think off then turn 3 reuses turn 2's prompt" [ "$r3" = "$p2" -a "$p3" -gt "$p2" ]
    expect "chat -n $n /think off acknowledged" grep -q '^\[thinking off\]' "$TMP/chat$n.err"
    expect "chat -n $n /reset: turn 4 starts over" [ "$(turn_field "$TMP/chat$n.err" 4 reused)" = 0 -a "$(turn_field "$TMP/chat$n.err" 4 prompt)" = "$p1" ]
    expect "chat -n $n /quit stops reading" [ -z "$(grep '^\[turn 5' "$TMP/chat$n.err")" ]
done
expect "chat -n 1: the session itself is the prefix" [ "$(turn_field "$TMP/chat1.err" 2 how)" = session ]
n_nothink=$(wc -w <<<"$(prompt_ids "$TMP/nothink.err")")
# a line of blanks is skipped as an empty line is (it was sent: an empty user turn once the template trims it)
printf ' \t \n\n"""\n  \n"""\nhi\n' | "$LILY" chat -m "$M" -n 1 >/dev/null 2>"$TMP/chat_blank.err"
printf 'hi\n' | "$LILY" chat -m "$M" -n 1 >/dev/null 2>"$TMP/chat_hi.err"
expect "chat skips a line of blanks and a blank block: one turn, the same prompt as 'hi' alone" \
    bash -c "[ \$(grep -c '^\[turn ' '$TMP/chat_blank.err') = 1 ] && [ '$(turn_field "$TMP/chat_hi.err" 1 prompt)' = '$(turn_field "$TMP/chat_blank.err" 1 prompt)' ]"
printf '/think off\nWrite a haiku.\n' | "$LILY" chat -m "$M" -n 1 >/dev/null 2>"$TMP/chat_nothink.err"
expect "chat /think off renders the empty think block ($n_nothink tokens)" [ "$(turn_field "$TMP/chat_nothink.err" 1 prompt)" = "$n_nothink" ]
expect "chat: deterministic replies" bash -c "'$LILY' chat -m '$M' -n 12 --seed 3 --temp 0 <<<'Tell me about dogs.' 2>/dev/null | cmp -s - <(head -c \$('$LILY' chat -m '$M' -n 12 --seed 3 --temp 0 <<<'Tell me about dogs.' 2>/dev/null | wc -c) '$TMP/chat12.out')"
expect "chat: turn 1 reply equals lily run's" bash -c "cmp -s <('$LILY' chat -m '$M' -n 12 --temp 0 <<<'Tell me about dogs.' 2>/dev/null) <('$LILY' run -m '$M' -p 'Tell me about dogs.' -n 12 --temp 0 2>/dev/null)"

# Ctrl-C: during a reply it stops the reply and the REPL reads on; at the prompt it exits (status 0).
if "$PY" - "$LILY" "$M" <<'PY'
import os, signal, subprocess, sys, threading
lily, model = sys.argv[1:]
p = subprocess.Popen([lily, "chat", "-m", model, "--temp", "0", "--ctx-size", "4096"], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
got = [0]
cond = threading.Condition()
def drain():  # count the reply bytes: Ctrl-C once a reply streams
    while True:
        b = os.read(p.stdout.fileno(), 4096)
        if not b:
            return
        with cond:
            got[0] += len(b)
            cond.notify_all()
threading.Thread(target=drain, daemon=True).start()
def wait_output(after):  # a reply runs until the context is full (seconds): wait until it streams
    with cond:
        assert cond.wait_for(lambda: got[0] > after, timeout=60)
err = []
def wait_stderr(prefix):
    for line in p.stderr:
        err.append(line.decode())
        if line.decode().startswith(prefix):
            return
    raise AssertionError("no %r on stderr: %s" % (prefix, "".join(err)))
p.stdin.write(b"Tell me a long story.\n"); p.stdin.flush()
wait_output(0)
p.send_signal(signal.SIGINT)         # stops the reply
wait_stderr("[turn 1:")
threading.Event().wait(0.3)          # the drain thread reads the rest of reply 1
with cond:
    before = got[0]
p.stdin.write(b"Shorter, please.\n"); p.stdin.flush()
wait_output(before)
p.send_signal(signal.SIGINT)         # stops the second reply (or its prefill)
wait_stderr("[turn 2:")
p.send_signal(signal.SIGINT)         # at the prompt: exits
p.wait(timeout=30)
err = "".join(err) + p.stderr.read().decode()
assert p.returncode == 0, (p.returncode, err)
assert err.count("[reply stopped]") == 2, err
print("Ctrl-C ok")
PY
then ok "chat: Ctrl-C stops a reply, the REPL goes on; Ctrl-C at the prompt exits"; else fail "chat Ctrl-C"; fi

# Ctrl-C during `lily run`: the reply stops, the speed line says "cancelled", exit status 130.
if "$PY" - "$LILY" "$M" <<'PY'
import os, signal, subprocess, sys
lily, model = sys.argv[1:]
p = subprocess.Popen([lily, "run", "-m", model, "--temp", "0", "--ctx-size", "4096", "-p", "Tell me a long story."],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
os.read(p.stdout.fileno(), 1)  # the reply streams (it runs until the context is full): Ctrl-C now
p.send_signal(signal.SIGINT)
out, err = p.communicate(timeout=60)
err = err.decode()
assert p.returncode == 130, (p.returncode, err)
assert err.rstrip().endswith("| cancelled"), err
PY
then ok "run: Ctrl-C stops the reply and exits 130"; else fail "run Ctrl-C"; fi

# --- the default model -------------------------------------------------------------------------------
LILY_MODEL="$M" "$LILY" run -p "Hi" -n 2 --temp 0 >/dev/null 2>"$TMP/default.err"; rc=$?
expect "run without -m uses \$LILY_MODEL and says so" bash -c "[ $rc = 0 ] && grep -q 'LILY_MODEL' '$TMP/default.err'"

finish
