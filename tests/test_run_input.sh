#!/usr/bin/env bash
# test_run_input.sh — what a new user meets first with `lily run` and model paths (tiny-chat model):
#   - `-p -` reads the prompt from stdin and `-f FILE` from a file: the same prompt ids as -p TEXT;
#   - without -n a reply stops at generation_config.json's max_new_tokens (tiny-chat: 128; a copy set to
#     7 stops at 7); -n wins, and -n 0 lifts the cap (the reply runs to its stop token);
#   - piped, the reasoning sits between a "<think>" line and a "</think>" line; --hide-reasoning drops it;
#   - a .gguf file, or a directory of them, is named as GGUF with what to use instead (run, info, serve);
#   - `lily debug tokenize` without --model uses the default model, as every command;
#   - --gpu-memory on the CPU backend is said to be ignored (it budgets GPU memory only), and the run goes on;
#     so are --n-cpu-moe N and --cpu-moe (routed experts in host memory: the CPU backend's are already there);
#     and chat / serve --cache-vram (a GPU checkpoint pool; the CPU backend keeps checkpoints in --cache-ram);
#     a --n-cpu-moe that is not a count >= 0 is a usage error (exit 2) in run, serve and bench.
# usage: bash test_run_input.sh <path-to-lily> <tests/data dir>
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
lily_test_init "$@"
M="$DATA/tiny-chat"

ids() { grep '^prompt ids:' "$1"; }
"$LILY" run -m "$M" -p "Hello there" -n 2 --temp 0 --show-ids >/dev/null 2>"$TMP/p.err"
echo "Hello there" | "$LILY" run -m "$M" -p - -n 2 --temp 0 --show-ids >/dev/null 2>"$TMP/stdin.err"
printf 'Hello there\n' > "$TMP/prompt.txt"
"$LILY" run -m "$M" -f "$TMP/prompt.txt" -n 2 --temp 0 --show-ids >/dev/null 2>"$TMP/file.err"
expect "-p - reads the prompt from stdin (same prompt ids as -p TEXT)" [ "$(ids "$TMP/p.err")" = "$(ids "$TMP/stdin.err")" ]
expect "-f FILE reads the prompt from a file (same prompt ids)" [ "$(ids "$TMP/p.err")" = "$(ids "$TMP/file.err")" ]
set +e
"$LILY" run -m "$M" -f "$TMP/missing.txt" >/dev/null 2>"$TMP/missing.err"; rc=$?
set -e
expect "-f with a missing file: exit 1 and the file named" \
    bash -c "[ $rc = 1 ] && grep -q 'cannot open $TMP/missing.txt' '$TMP/missing.err'"
set +e
"$LILY" run -m "$M" -p - </dev/null >/dev/null 2>"$TMP/empty.err"; rc=$?
set -e
expect "-p - with nothing on stdin: exit 1, 'empty' said" \
    bash -c "[ $rc = 1 ] && grep -q 'prompt from stdin is empty' '$TMP/empty.err'"
set +e
"$LILY" run -m "$M" -p "" -n 2 >"$TMP/empty_p.out" 2>"$TMP/empty_p.err"; rc=$?
set -e
expect "-p \"\" is refused as an empty stdin is: exit 1, 'empty' said, nothing generated" \
    bash -c "[ $rc = 1 ] && grep -q 'prompt is empty' '$TMP/empty_p.err' && [ ! -s '$TMP/empty_p.out' ]"

# a prompt of blanks is the empty message once the chat template trims it: refused as -p "" is (it ran an
# empty user turn); with --raw the blanks are the text to continue
set +e
"$LILY" run -m "$M" -p $' \t ' -n 2 >"$TMP/blank_p.out" 2>"$TMP/blank_p.err"; rc=$?
printf '\n\n' | "$LILY" run -m "$M" -p - -n 2 >/dev/null 2>"$TMP/blank_in.err"; rc_in=$?
"$LILY" run -m "$M" --raw -p " " -n 2 >/dev/null 2>"$TMP/blank_raw.err"; rc_raw=$?
set -e
expect "-p of blanks is refused: exit 1, 'only whitespace' said, nothing generated" \
    bash -c "[ $rc = 1 ] && grep -q 'prompt is empty (only whitespace' '$TMP/blank_p.err' && [ ! -s '$TMP/blank_p.out' ]"
expect "-p - of blank lines likewise" bash -c "[ $rc_in = 1 ] && grep -q 'only whitespace' '$TMP/blank_in.err'"
expect "--raw -p ' ' continues the blank" bash -c "[ $rc_raw = 0 ] && grep -q '| length (-n 2)' '$TMP/blank_raw.err'"

gen() { sed -n 's/.*decode: \([0-9]*\) tokens.*/\1/p' "$1"; }
"$LILY" run -m "$M" -p "Hi" --temp 0 >/dev/null 2>"$TMP/cap.err"
expect "no -n: capped at tiny-chat's max_new_tokens 128 (got $(gen "$TMP/cap.err"))" [ "$(gen "$TMP/cap.err")" = 128 ]
cp -r "$M" "$TMP/m7"
sed -i 's/"max_new_tokens": 128/"max_new_tokens": 7/' "$TMP/m7/generation_config.json"
"$LILY" run -m "$TMP/m7" -p "Hi" --temp 0 >/dev/null 2>"$TMP/cap7.err"
expect "no -n: capped at the model's max_new_tokens 7 (got $(gen "$TMP/cap7.err"))" [ "$(gen "$TMP/cap7.err")" = 7 ]
"$LILY" run -m "$TMP/m7" -p "Hi" --temp 0 -n 11 >/dev/null 2>"$TMP/n11.err"
expect "-n 11 wins over max_new_tokens (got $(gen "$TMP/n11.err"))" [ "$(gen "$TMP/n11.err")" = 11 ]
expect "the speed line says which limit ended the reply: generation_config.json's max_new_tokens" \
    grep -qF "| length (max_new_tokens 7 of generation_config.json; -n sets another)" "$TMP/cap7.err"
expect "... or -n" grep -qF "| length (-n 11)" "$TMP/n11.err"
"$LILY" run -m "$M" -p "Hi" --temp 0 -n 100 -c 30 >/dev/null 2>"$TMP/ctx.err"
expect "... or the full context, naming the option to raise (it said only 'length' for all three)" \
    grep -qF "| length (the context is full: 30 tokens; --ctx-size sets it)" "$TMP/ctx.err"
"$LILY" run -m "$TMP/m7" -p "Hi" --temp 0 -n 0 >/dev/null 2>"$TMP/n0.err"
"$LILY" run -m "$M" -p "Hi" --temp 0 -n 0 >/dev/null 2>"$TMP/n0_128.err"
expect "-n 0 is no cap: max_new_tokens 7 lifted, the reply runs to its stop token as with 128 (got $(gen "$TMP/n0.err"))" \
    bash -c "[ $(gen "$TMP/n0.err") -gt 7 ] && [ $(gen "$TMP/n0.err") = $(gen "$TMP/n0_128.err") ] && grep -q '| stop' '$TMP/n0.err'"

"$LILY" run -m "$M" -p "Hi" --temp 0 -n 12 > "$TMP/piped.out" 2>/dev/null
expect "piped: the reply opens with a <think> line" [ "$(head -1 "$TMP/piped.out")" = "<think>" ]
expect "piped: the reasoning ends with a </think> line" grep -qx '</think>' "$TMP/piped.out"
"$LILY" run -m "$M" -p "Hi" --temp 0 -n 12 --hide-reasoning > "$TMP/hidden.out" 2>/dev/null
expect "--hide-reasoning: no <think> markers" bash -c "! grep -q 'think>' '$TMP/hidden.out'"

mkdir -p "$TMP/gg"
printf 'GGUF\003\000\000\000' > "$TMP/gg/Qwen3.6-35B-A3B-Q4_K_M.gguf"
for cmd in "run -p hi" info; do
    set +e
    "$LILY" $cmd -m "$TMP/gg/Qwen3.6-35B-A3B-Q4_K_M.gguf" >/dev/null 2>"$TMP/g.err"; rc=$?
    set -e
    expect "${cmd%% *} -m FILE.gguf: exit 1, says GGUF and what to use" \
        bash -c "[ $rc = 1 ] && grep -q 'is a GGUF file (llama.cpp' '$TMP/g.err' && grep -q 'Hugging Face safetensors' '$TMP/g.err' && grep -q 'MLX 4-bit' '$TMP/g.err'"
done
set +e
"$LILY" info -m "$TMP/gg" >/dev/null 2>"$TMP/gd.err"; rc=$?
set -e
expect "info -m DIR-of-gguf: says the directory holds GGUF files" \
    bash -c "[ $rc = 1 ] && grep -q 'holds GGUF files (Qwen3.6-35B-A3B-Q4_K_M.gguf' '$TMP/gd.err'"
set +e
timeout 60 "$LILY" serve -m "$TMP/gg" --port 0 >/dev/null 2>"$TMP/gs.err"; rc=$?
set -e
expect "serve -m DIR-of-gguf: exits 1 naming GGUF" bash -c "[ $rc = 1 ] && grep -q 'GGUF files' '$TMP/gs.err'"

printf 'hello' | "$LILY" debug tokenize --ids > "$TMP/tok.out" 2>"$TMP/tok.err"
expect "debug tokenize without --model uses the default model" \
    bash -c "grep -q 'no -m given' '$TMP/tok.err' && [ -s '$TMP/tok.out' ]"

"$LILY" run -m "$M" -p "Hi" -n 2 --temp 0 --gpu-memory 8 >/dev/null 2>"$TMP/gm.err"
expect "--gpu-memory on the CPU backend: a line says it is ignored, the reply still runs" \
    bash -c "grep -q -- '--gpu-memory applies to --backend cuda only; the cpu backend ignores it' '$TMP/gm.err' && \
             grep -q 'decode: 2 tokens' '$TMP/gm.err'"
for flag in "--n-cpu-moe 4" "--cpu-moe"; do
    # shellcheck disable=SC2086
    "$LILY" run -m "$M" -p "Hi" -n 2 --temp 0 $flag >/dev/null 2>"$TMP/cm.err"
    expect "$flag on the CPU backend: a line says it does not apply, the reply still runs" \
        bash -c "grep -q -- '--n-cpu-moe / --cpu-moe apply to --backend cuda only' '$TMP/cm.err' && \
                 grep -q 'decode: 2 tokens' '$TMP/cm.err'"
done
printf '/quit\n' | "$LILY" chat -m "$M" -n 2 --cache-vram 64 >/dev/null 2>"$TMP/cv.err"
expect "chat --cache-vram on the CPU backend: a line says it does not apply (it was ignored without a word)" \
    grep -q -- '--cache-vram applies to --backend cuda only; the cpu backend keeps prefix-cache checkpoints in host memory' \
    "$TMP/cv.err"
set +e
timeout 60 "$LILY" serve -m "$M" --port 0 --cache-vram 64 >/dev/null 2>"$TMP/sv.err" &
spid=$!
for _ in $(seq 100); do grep -q 'model loaded' "$TMP/sv.err" && break; sleep 0.1; done
kill -TERM "$spid"; wait "$spid"
set -e
expect "serve --cache-vram on the CPU backend: the same line" \
    grep -q -- '--cache-vram applies to --backend cuda only' "$TMP/sv.err"
# --backend cuda in a build without it: the one error, never "--cache-vram applies to --backend cuda only; the
# cuda backend keeps ..." (serve and chat give cuda a --cache-vram default) nor "the cuda backend ignores it"
"$LILY" run -m "$M" -p hi -n 1 --backend cuda >/dev/null 2>"$TMP/nocuda_run.err" || true
if grep -q "backend 'cuda' is not available in this build" "$TMP/nocuda_run.err"; then
    set +e
    printf '/quit\n' | "$LILY" chat -m "$M" --backend cuda --gpu-memory 8 >/dev/null 2>"$TMP/nocuda_chat.err"
    timeout 60 "$LILY" serve -m "$M" --port 0 --backend cuda >/dev/null 2>"$TMP/nocuda_serve.err"
    set -e
    for c in chat serve; do
        expect "$c --backend cuda without cuda in the build: only that error" \
            bash -c "grep -q \"backend 'cuda' is not available in this build\" '$TMP/nocuda_$c.err' && \
                     ! grep -q 'applies to --backend cuda only' '$TMP/nocuda_$c.err'"
    done
else
    echo "SKIP --backend cuda without cuda: this build has it"
fi
for cmd in run serve bench; do
    set +e
    "$LILY" $cmd -m "$M" --n-cpu-moe -1 >/dev/null 2>"$TMP/cmbad.err" </dev/null; rc=$?
    set -e
    expect "$cmd --n-cpu-moe -1: usage error naming the option" \
        bash -c "[ $rc = 2 ] && grep -q -- '--n-cpu-moe expects an integer' '$TMP/cmbad.err'"
done
finish
