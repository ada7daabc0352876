#!/usr/bin/env bash
# test_cli_usage.sh — usage errors name what is wrong: `lily debug --help` (exit 0, the subcommands on
# stdout), `lily debug SUB` with an unknown SUB (exit 2, "unknown subcommand 'SUB'"), `lily info -m` without
# a value (exit 2, "-m needs a value"), and `lily debug tokenize` errors prefixed with the command's name.
# `lily serve --help` lists every route; serve's start-up says the model is loading, then that it stopped.
# An unknown --backend is a usage error in every command that takes one (exit 2, the backends listed), and
# so is a --precision other than fast / exact (on the cpu backend: fast is the default, exact the reference); every command
# (debug tokenize / render / parse included) takes --opt=value and says "--X needs a value", and --threads is 0 (all cores) or 1..4096 everywhere;
# info, eval and perplexity without -m use $LILY_MODEL like run/chat/serve/bench (same output as -m);
# a NaN reference logit is an error in eval and perplexity, and output lost to a full device fails the command;
# bench's default sweep stops at the model's max_position_embeddings and lengths past it get a warning;
# bench --sampling / --device on the cpu backend say they apply to cuda only.
# usage: bash test_cli_usage.sh <path-to-lily> <tests/data dir>
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
lily_test_init "$@"
lily_python "$LILY"
check() { # name, expected exit status, file to grep (out|err), fixed string, lily args...
    local name=$1 want_rc=$2 where=$3 msg=$4; shift 4
    $CHECK_PREFIX "$LILY" "$@" >"$TMP/out" 2>"$TMP/err" <"$TMP/stdin"; local rc=$?
    if [ "$rc" = "$want_rc" ] && grep -qF -- "$msg" "$TMP/$where"; then
        echo "ok   $name"; passes=$((passes + 1))
    else
        echo "FAIL $name (exit $rc; stdout: $(head -c 200 "$TMP/out"); stderr: $(head -c 200 "$TMP/err"))"
        fails=$((fails + 1))
    fi
}
CHECK_PREFIX= # e.g. "timeout 30" for a command that would not stop by itself
: >"$TMP/stdin"
check "debug --help lists the subcommands on stdout" 0 out "  tokenize  the token ids of the text on stdin" debug --help
check "lily help run is run's --help (it printed the command list)" 0 out "usage: lily run [-m DIR]" help run
check "lily help with an unknown command names it" 2 err "lily: unknown command 'bogus'" help bogus
check "lily version and -V print the version as --version does" 0 out "lily " version
check "debug with an unknown subcommand names it" 2 err "lily debug: unknown subcommand 'bogus'" debug bogus
check "debug without a subcommand prints the usage" 2 err "usage: lily debug tokenize|render|parse" debug
check "info -m without a value says so" 2 err "lily info: -m needs a value" info -m
if "$LILY" serve --help >/dev/null 2>&1; then # built with libmicrohttpd
    check "serve --help lists GET /metrics" 0 out "GET /metrics (Prometheus text)" serve --help
    check "serve --help lists the Anthropic route" 0 out "POST /v1/messages, POST /v1/messages/count_tokens" serve --help
    check "serve --help lists the Responses route" 0 out "POST /v1/responses (stateless)" serve --help
    check "lily --help says serve speaks both APIs" 0 out "serve       OpenAI- and Anthropic-compatible HTTP server" --help
    # HTTP starts before the model loads: the first line says the model is loading, not just "listening"
    check "serve says the model is loading while it listens" 1 err \
        "lily serve: loading model 'nope' from $TMP/nope; meanwhile listening on http://127.0.0.1:" \
        serve -m "$TMP/nope" --port 0
    check "serve stops when the model fails to load" 1 err "; stopping the server" serve -m "$TMP/nope" --port 0
    # --host [::1], an IPv6 address as the start-up line writes it, is that address (it was "cannot resolve host")
    if "$PY" -c 'import socket; s = socket.socket(socket.AF_INET6); s.bind(("::1", 0))' 2>/dev/null; then
        check "serve --host [::1] listens on ::1" 1 err \
            "lily serve: loading model 'nope' from $TMP/nope; meanwhile listening on http://[::1]:" \
            serve -m "$TMP/nope" --port 0 --host "[::1]"
    else
        echo "SKIP serve --host [::1]: no IPv6 loopback here"
    fi
    # the model id without --alias: the directory "." or ".." stands for (it was "." or "..", an id a client's
    # URL normalization drops from /v1/models/ID), and a hub snapshot's repo id (it was the revision's hash)
    mkdir -p "$TMP/served-dir/sub" "$TMP/models--Org--Name-4bit/snapshots/0123abc"
    check "serve -m DIR/. names the model after DIR" 1 err "lily serve: loading model 'served-dir' from $TMP/served-dir/.;" \
        serve -m "$TMP/served-dir/." --port 0
    check "serve -m DIR/sub/.. names the model after DIR" 1 err \
        "lily serve: loading model 'served-dir' from $TMP/served-dir/sub/..;" serve -m "$TMP/served-dir/sub/.." --port 0
    check "serve -m a hub snapshot names the model by its repo id" 1 err \
        "lily serve: loading model 'Org/Name-4bit' from $TMP/models--Org--Name-4bit/snapshots/0123abc/;" \
        serve -m "$TMP/models--Org--Name-4bit/snapshots/0123abc/" --port 0
    # --cors-origin entries that no browser Origin can match, and an empty --alias, are usage errors naming
    # the value (they were accepted, or "missing option value" and the whole usage)
    check "serve --cors-origin chat.example.com is not an origin" 2 err \
        "lily serve: --cors-origin: 'chat.example.com' is not an origin; write it as a browser sends it" \
        serve -m "$TMP/nope" --cors-origin chat.example.com
    check "serve --cors-origin with a path is not an origin" 2 err \
        "lily serve: --cors-origin: 'https://a.example/app' is not an origin" \
        serve -m "$TMP/nope" --cors-origin "https://a.example, https://a.example/app"
    check "serve --cors-origin '' is empty" 2 err "lily serve: --cors-origin is empty" serve -m "$TMP/nope" --cors-origin ""
    check "serve --alias '' is empty" 2 err "lily serve: --alias is empty" serve -m "$TMP/nope" --alias ""
fi
printf '\xff' >"$TMP/stdin"
check "debug tokenize errors carry the command's name" 1 err \
    "lily debug tokenize: text is not valid UTF-8 (byte 0 of 1)" debug tokenize --model "$DATA/tiny-chat"

# --- unknown backend names: exit 2 and the list, in every command -----------------------------------
: >"$TMP/stdin"
M="$DATA/tiny-chat"
for args in "run -m $M -p hi" "chat -m $M" "serve -m $M" "bench -m $M" "eval -m $M --tokens 1,2" \
            "perplexity -m $M --tokens-file $TMP/none"; do
    cmd=${args%% *}
    # shellcheck disable=SC2086
    check "$cmd --backend metal is a usage error listing the backends" 2 err \
        "lily $cmd: unknown backend 'metal' (backends: cpu, cuda" $args --backend metal
done
check "run --backend=metal too" 2 err "lily run: unknown backend 'metal'" run -m "$M" -p hi --backend=metal

# --- --top-p: [0, 1] in every command, 0 = greedy (run refused 0 with "(0, 1]" while serve's top_p 0 was greedy) ---
for args in "run -m $M -p hi" "chat -m $M" "serve -m $M"; do
    cmd=${args%% *}
    # shellcheck disable=SC2086
    check "$cmd --top-p 1.5 names the range [0, 1]" 2 err \
        "lily $cmd: --top-p expects a number in [0, 1], got \"1.5\"" $args --top-p 1.5
    # shellcheck disable=SC2086
    check "$cmd --top-p -0.1 names the range [0, 1]" 2 err \
        "lily $cmd: --top-p expects a number in [0, 1], got \"-0.1\"" $args --top-p=-0.1
done
check "run --top-p 0 is accepted" 0 out "" run -m "$M" -p hi -n 2 --top-p 0
# --- --seed: a non-negative integer or -1; " -5" was read by strtoull as 2^64-5 ---
check "run --seed ' -5' is a usage error" 2 err 'lily run: --seed expects a non-negative integer, or -1' \
    run -m "$M" -p hi -n 1 --seed " -5"
check "run --seed -2 is a usage error" 2 err 'lily run: --seed expects a non-negative integer, or -1' \
    run -m "$M" -p hi -n 1 --seed=-2
check "serve --top-p 0 is accepted (the model load fails next)" 1 err "lily serve: loading model 'nope'" \
    serve -m "$TMP/nope" --port 0 --top-p 0
check "run --help: --top-p 0 is greedy" 0 out "--top-p P          nucleus cut in [0, 1]; 0 = greedy" run --help

# --- --precision fast|exact: a bad value is a usage error in every command; both reach the cpu backend ---
for args in "run -m $M -p hi" "chat -m $M" "serve -m $M" "bench -m $M" "eval -m $M --tokens 1,2" \
            "perplexity -m $M --tokens-file $TMP/none"; do
    cmd=${args%% *}
    # shellcheck disable=SC2086
    check "$cmd --precision half is a usage error" 2 err \
        "lily $cmd: --precision expects fast or exact, got \"half\"" $args --precision half
done
"$LILY" eval -m "$M" --tokens 1,2,3 --logits-out "$TMP/default.f32" >/dev/null 2>&1
"$LILY" eval -m "$M" --tokens 1,2,3 --precision fast --logits-out "$TMP/fast.f32" >/dev/null 2>&1
"$LILY" eval -m "$M" --tokens 1,2,3 --precision exact --logits-out "$TMP/exact.f32" >/dev/null 2>&1
if [ -s "$TMP/fast.f32" ] && cmp -s "$TMP/fast.f32" "$TMP/default.f32" && ! cmp -s "$TMP/fast.f32" "$TMP/exact.f32"; then
    ok "eval on cpu: fast is the default, exact reaches the backend (other logits)"
else
    fail "eval on cpu: fast is the default, exact reaches the backend (other logits)"
fi
check "run --help names --precision" 0 out "--precision P      fast (default) or exact" run --help

# --- --opt=value and "needs a value" the same in every command; one --threads rule: 0 = all cores, 1..4096 ---
for args in "run -m $M -p hi" "chat -m $M" "serve -m $M" "bench -m $M" "eval -m $M --tokens 1,2" \
            "perplexity -m $M --tokens-file $TMP/none"; do
    cmd=${args%% *}
    # shellcheck disable=SC2086
    check "$cmd --precision=half reaches the value check" 2 err \
        "lily $cmd: --precision expects fast or exact, got \"half\"" $args --precision=half
    # shellcheck disable=SC2086
    check "$cmd --precision without a value says so" 2 err "lily $cmd: --precision needs a value" $args --precision
    # shellcheck disable=SC2086
    check "$cmd --threads 4097 is a usage error" 2 err \
        "lily $cmd: --threads expects an integer in [0, 4096], got \"4097\"" $args --threads 4097
    # shellcheck disable=SC2086
    check "$cmd --threads=-1 is a usage error" 2 err \
        "lily $cmd: --threads expects an integer in [0, 4096], got \"-1\"" $args --threads=-1
done
# the debug subcommands take --model=DIR, --request=FILE and --tools=FILE too, and say when a value is missing
printf 'hi' >"$TMP/stdin"
check "debug tokenize --model=DIR" 0 out "80 81" debug tokenize --model="$M" --ids
printf '{"messages": [{"role": "user", "content": "hi"}]}' >"$TMP/req.json"
check "debug render --model=DIR --request=FILE" 0 out "<|im_start|>assistant" debug render --model="$M" --request="$TMP/req.json"
printf '[]' >"$TMP/tools.json"
check "debug parse --model=DIR --tools=FILE" 0 out '"finish_reason": "length"' debug parse --model="$M" --tools="$TMP/tools.json" --length
# chat's prefix-cache options take the = form too (they were 'unknown option'), and a bad value names the range
printf '/quit\n' >"$TMP/stdin"
check "chat --cache-ram=64 --cache-vram=8 --checkpoint-every=100 are parsed" 0 err \
    "lily: --cache-vram applies to --backend cuda only" chat -m "$M" --cache-ram=64 --cache-vram=8 --checkpoint-every=100
check "chat --cache-ram= (empty) names the range" 2 err \
    "lily chat: --cache-ram expects an integer in [1, 16777216], got \"\"" chat -m "$M" --cache-ram=
check "chat --cache-vram without a value says so" 2 err "lily chat: --cache-vram needs a value" chat -m "$M" --cache-vram
# a --cache-ram past the machine's physical memory (or a container's cgroup limit, when lower) can never be
# honoured: a usage error naming both sizes in chat and serve (16777216 MiB was accepted, the cache left to
# grow until the kernel killed the process)
PHYS_MIB=$(( $(getconf _PHYS_PAGES) * $(getconf PAGESIZE) / 1048576 ))
for f in /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes; do # a container sees its own
    v=$(cat "$f" 2>/dev/null || true)
    if [[ "$v" =~ ^[0-9]+$ ]] && [ ${#v} -lt 19 ] && [ $((v / 1048576)) -lt "$PHYS_MIB" ]; then
        PHYS_MIB=$((v / 1048576))
    fi
done
for args in "chat -m $M" "serve -m $TMP/nope --port 0"; do
    cmd=${args%% *}
    # shellcheck disable=SC2086
    check "$cmd --cache-ram one MiB past the machine's memory is a usage error" 2 err \
        "lily $cmd: --cache-ram $((PHYS_MIB + 1)) MiB is more than the memory this process may use ($PHYS_MIB MiB" \
        $args --cache-ram $((PHYS_MIB + 1))
    # shellcheck disable=SC2086
    check "$cmd --cache-ram=16777216 is a usage error" 2 err \
        "lily $cmd: --cache-ram 16777216 MiB is more than the memory this process may use ($PHYS_MIB MiB" \
        $args --cache-ram=16777216
done
check "chat --cache-ram of exactly the machine's memory is accepted" 0 err \
    "lily: --cache-vram applies to --backend cuda only" chat -m "$M" --cache-ram $PHYS_MIB --cache-vram=8
: >"$TMP/stdin"
for sub in tokenize render parse; do
    check "debug $sub --help prints its usage on stdout" 0 out "usage: lily debug $sub" debug $sub --help
done
check "debug parse --tools without a value says so" 2 err "lily debug parse: --tools needs a value" debug parse --tools
check "debug render -r without a value says so" 2 err "lily debug render: -r needs a value" debug render -r
: >"$TMP/stdin"
check "perplexity --precision alone is not the whole usage" 2 err "lily perplexity: --precision needs a value" \
    perplexity --precision
expect "perplexity --precision alone prints no usage" bash -c "! grep -q usage: '$TMP/err'"
check "bench --threads 99999 is a usage error" 2 err "lily bench: --threads expects an integer in [0, 4096]" \
    bench -m "$M" --threads 99999
# a word that is not an option is named as such, not as an "unknown option": the prompt of run goes after -p
check "run with a bare prompt says it goes after -p" 2 err \
    "lily run: unexpected argument 'Why is the sky blue?' (the prompt goes after -p: lily run -p \"Why is the sky blue?\")" \
    run -m "$M" "Why is the sky blue?"
check "serve with a bare port says every value follows its option" 2 err \
    "lily serve: unexpected argument '8080' (every value follows its option" serve -m "$M" 8080
check "an unknown option is still called one" 2 err "lily eval: unknown option '--bogus'" eval --bogus
# an option of llama.cpp or vLLM, typed out of habit, says what lily does instead (it was "unknown option" alone)
check "run -ngl says llama.cpp's and what lily does" 2 err \
    "lily run: unknown option '-ngl' (llama.cpp's option; --backend cuda runs every layer on the GPU; --n-cpu-moe N or --cpu-moe keeps routed experts in host memory)" \
    run -m "$M" -p hi -ngl 99
check "serve --max-model-len names --ctx-size" 2 err \
    "lily serve: unknown option '--max-model-len' (vLLM's option; lily's is --ctx-size N)" serve -m "$M" --max-model-len 4096
check "serve --tensor-parallel-size=2 (the = form) says one GPU" 2 err \
    "lily serve: unknown option '--tensor-parallel-size=2' (vLLM's option; lily runs on one GPU: for several, serve the Hugging Face checkpoint with vLLM or SGLang)" \
    serve -m "$M" --tensor-parallel-size=2
check "chat --jinja says the template is built in" 2 err \
    "lily chat: unknown option '--jinja' (llama.cpp's option; lily renders the Qwen3.6 chat template itself: nothing to set)" \
    chat -m "$M" --jinja
# run / chat -c 0 is the default context, as serve's --ctx-size 0 and llama.cpp's -c 0 (it was a usage error)
check "run -c 0 runs with the default context" 0 err "| length (-n 2)" run -m "$M" -p hi -c 0 -n 2 --temp 0
check "run -c past 16M names serve's range" 2 err 'lily run: -c expects an integer in [0, 16777216], got "16777217"' \
    run -m "$M" -p hi -c 16777217
# a context smaller than a chat's template and one reply token could serve nothing (serve started, then every
# request failed): refused at start-up naming the minimum, 16; 16 itself runs
for c in 1 15; do
    CHECK_PREFIX="timeout 30" # without the check, serve would start serving
    check "serve --ctx-size $c names the minimum" 2 err "lily serve: --ctx-size $c is too small: the minimum is 16 tokens" \
        serve -m "$M" --port 0 --ctx-size $c
    CHECK_PREFIX=
    check "run -c $c names the minimum" 2 err "lily run: -c $c is too small: the minimum is 16 tokens" run -m "$M" -p hi -c $c
done
check "chat --ctx-size=8 names the minimum" 2 err "lily chat: --ctx-size 8 is too small: the minimum is 16 tokens" \
    chat -m "$M" --ctx-size=8
check "run -c 16 with a raw one-token prompt runs" 0 err "| length (-n 1)" run -m "$M" --raw -p a -c 16 -n 1 --temp 0
# -m naming no directory, or a file: every command says so about the directory (info, eval, perplexity and
# bench said "DIR/config.json: cannot open (No such file or directory)" or "(Not a directory)")
printf x >"$TMP/afile"; printf "1 2 3 4 5\n" >"$TMP/five.tok"
mkdir -p "$TMP/nomodel" "$TMP/models--Qwen--X/snapshots/0123abc" "$TMP/models--Qwen--X/refs"
for args in "info" "eval --tokens 1" "perplexity --tokens-file $TMP/five.tok" "perplexity -f $TMP/five.tok" \
            "bench -p 8 -n 0 -r 1" "run -p hi" "chat"; do
    check "${args%% *} -m MISSING names the model directory" 1 err \
        "lily ${args%% *}: model directory $TMP/missing: No such file or directory" $args -m "$TMP/missing"
    check "${args%% *} -m FILE says it is not a model directory" 1 err \
        "lily ${args%% *}: $TMP/afile is not a model directory (expected a directory with config.json" $args -m "$TMP/afile"
    check "${args%% *} -m a directory without config.json says so (run said tokenizer.json: cannot open)" 1 err \
        "lily ${args%% *}: $TMP/nomodel is not a model directory: it has no config.json" $args -m "$TMP/nomodel"
    check "${args%% *} -m a Hugging Face cache folder names the snapshot to pass" 1 err \
        "lily ${args%% *}: $TMP/models--Qwen--X is a Hugging Face cache folder, not a model directory: pass its snapshot, $TMP/models--Qwen--X/snapshots/0123abc" \
        $args -m "$TMP/models--Qwen--X"
done
# -m naming a file of a model directory, as llama.cpp's -m names its one file, names the directory to pass
for f in model.safetensors config.json; do
    check "run -m DIR/$f names DIR" 1 err "lily run: $M/$f is a file, not a model directory: pass the directory that holds it, -m $M" \
        run -m "$M/$f" -p hi
done
(cd "$M" && "$LILY" info -m config.json >"$TMP/out" 2>"$TMP/err")
if grep -qF "lily info: config.json is a file, not a model directory: pass the directory that holds it, -m ." "$TMP/err"; then
    echo "ok   info -m config.json in the model directory names ."; passes=$((passes + 1))
else
    echo "FAIL info -m config.json in the model directory names . ($(head -c 200 "$TMP/err"))"; fails=$((fails + 1))
fi
# a prompt file that cannot be read says why (it was "cannot read DIR" for a directory)
check "run -f DIR says it is a directory" 1 err "lily run: cannot read $TMP/nomodel: Is a directory" \
    run -m "$M" -f "$TMP/nomodel"
# -m ORG/NAME that is no directory here, as vLLM and transformers take a Hugging Face repo id: lily downloads
# nothing, so it says how to get the files, or names the snapshot the hub cache ($HF_HUB_CACHE, else
# $HF_HOME/hub) holds (refs/main's revision, else the only one); both said only "No such file or directory"
REPO=lily-test-org/no-such-model HUB="$TMP/hf/hub/models--lily-test-org--no-such-model"
HF_HUB_CACHE="$TMP/nohub" check "run -m ORG/NAME says lily downloads nothing and how to get it" 1 err \
    "lily run: model directory $REPO: No such file or directory (lily downloads nothing: if $REPO is a Hugging Face repo, \`hf download $REPO --local-dir DIR\`, then -m DIR)" \
    run -m "$REPO" -p hi
mkdir -p "$HUB/snapshots/0123abc" "$HUB/refs"
HF_HUB_CACHE= HF_HOME="$TMP/hf" check "info -m ORG/NAME names the only snapshot in the hub cache" 1 err \
    "lily info: model directory $REPO: No such file or directory; the Hugging Face cache holds $REPO: pass its snapshot, -m $HUB/snapshots/0123abc" \
    info -m "$REPO"
mkdir -p "$HUB/snapshots/4567def"; echo 4567def >"$HUB/refs/main"
HF_HUB_CACHE="$TMP/hf/hub" check "serve -m ORG/NAME names refs/main's snapshot" 1 err \
    "the Hugging Face cache holds $REPO: pass its snapshot, -m $HUB/snapshots/4567def" serve -m "$REPO" --port 0
check "-m ./ORG/NAME is a path, not a repo id" 1 err "lily info: model directory ./$REPO: No such file or directory" \
    info -m "./$REPO"
# a checkpoint of another family with a tokenizer lily cannot load (Gemma's: SentencePiece as Unigram) is
# named by its model_type in every command that loads a model; run, chat, serve and perplexity said only
# "tokenizer.json: unsupported model type Unigram", the tokenizer being read before config.json
mkdir -p "$TMP/gemma"
printf '%s' '{"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_size": 2048, "vocab_size": 256000}' \
    >"$TMP/gemma/config.json"
printf '%s' '{"version": "1.0", "model": {"type": "Unigram", "vocab": [["a", 0.0]]}, "added_tokens": []}' \
    >"$TMP/gemma/tokenizer.json"
for args in "run -p hi" "chat" "perplexity -f $TMP/five.tok" "info" "serve --port 0"; do
    check "${args%% *} names another family's model_type before its tokenizer" 1 err \
        "$TMP/gemma: config.json: model_type 'gemma' (GemmaForCausalLM) is not a Qwen3.5/3.6 MoE model" \
        $args -m "$TMP/gemma"
done
check "info -x is an unknown option (it was an 'unexpected argument')" 2 err "lily info: unknown option '-x'" info -x
# bench's bad values name what was expected (they said only "bad value '0' for -r"); --plot's name and
# directory are checked before the model loads (they failed in gnuplot after the sweep)
check "bench -r 0 names the range" 2 err 'lily bench: -r expects an integer in [1, 1000], got "0"' bench -m "$M" -r 0
check "bench -d 99999999 names the range" 2 err \
    'lily bench: -d expects up to 64 comma-separated depths in [0, 16777216] (4k = 4096), or none, got "99999999"' \
    bench -m "$M" -d 99999999
# an empty item in a -p / -d list is a usage error (",", "64,,128" and "64," were read as none or with it
# dropped), and so is a sweep with no rows at all (it printed an empty table and exited 0)
check "bench -p , is a usage error" 2 err \
    'lily bench: -p expects up to 64 comma-separated lengths in [1, 16777216] (4k = 4096), or none, got ","' \
    bench -m "$M" -p , -n 0
check "bench -p 16,,32 is a usage error" 2 err 'got "16,,32"' bench -m "$M" -p 16,,32 -n 0
check "bench -d 16, is a usage error" 2 err \
    'lily bench: -d expects up to 64 comma-separated depths in [0, 16777216] (4k = 4096), or none, got "16,"' \
    bench -m "$M" -p none -d 16,
check "bench -p none -n 0 has nothing to measure" 2 err \
    "lily bench: nothing to measure: -p none leaves no prefill rows and -n 0 no decode rows" bench -m "$M" -p none -n 0
check "bench -p none -d none has nothing to measure" 2 err \
    "lily bench: nothing to measure: -p none leaves no prefill rows and -d none no decode rows" \
    bench -m "$M" -p none -d none
check "bench -o xml names the formats" 2 err 'lily bench: -o expects md, json or csv, got "xml"' bench -m "$M" -o xml
if command -v gnuplot >/dev/null 2>&1; then
    check "bench --plot FILE.jpg is a usage error before the sweep" 2 err \
        "lily bench: --plot writes PNG or SVG: give a FILE.png or FILE.svg, got \"$TMP/x.jpg\"" \
        bench -m "$M" -p 16 -n 0 -r 1 --no-warmup --plot "$TMP/x.jpg"
    check "bench --plot in a missing directory fails before the model loads" 1 err \
        "lily bench: --plot $TMP/nope/x.png: cannot write: No such file or directory" \
        bench -m "$M" -p 16 -n 0 -r 1 --no-warmup --plot "$TMP/nope/x.png"
    expect "... without loading it" bash -c "! grep -q loading '$TMP/err'"
fi
"$LILY" eval -m "$M" --tokens 1,2,3 --threads 0 --logits-out "$TMP/t0.f32" >/dev/null 2>&1
"$LILY" eval -m "$M" --tokens 1,2,3 --threads=1 --logits-out "$TMP/t1.f32" >/dev/null 2>&1
expect "eval --threads 0 (all cores) gives the --threads=1 logits" bash -c "[ -s '$TMP/t0.f32' ] && cmp -s '$TMP/t0.f32' '$TMP/t1.f32'"
printf '1 2 3 4 5\n' >"$TMP/five.tok"
check "perplexity --special with --tokens-file is a usage error (it was ignored)" 2 err \
    "lily perplexity: --special applies to -f TEXT" perplexity -m "$M" --tokens-file "$TMP/five.tok" --special
check "perplexity --threads=0 and --ctx=4 run" 0 out "perplexity: " perplexity -m "$M" --tokens-file "$TMP/five.tok" --threads=0 --ctx=4
check "run --threads 0 runs" 0 err "prefill: " run -m "$M" -p hi --threads 0 -n 2 --temp 0
check "chat --help gives -n's default as the program applies it" 0 out \
    "full context (default: generation_config.json's max_new_tokens when it" chat --help
check "run --help says -n 0 is no cap" 0 out "generate at most N tokens per reply; 0 = no cap" run --help
check "the shared help states the --threads rule" 0 out "CPU threads: 0 = all cores (the default), at most 4096" run --help

# --- a non-finite reference is an error, not perfect agreement; lost output is a failure ------------------
"$PY" - "$M/config.json" "$TMP/nan.f32" <<'PY' # [3, vocab] fp32 NaN
import json, struct, sys
cfg = json.load(open(sys.argv[1]))
vocab = cfg.get("text_config", cfg)["vocab_size"]
open(sys.argv[2], "wb").write(struct.pack("<f", float("nan")) * (3 * vocab))
PY
check "eval --reference with a NaN logit names it" 1 err "logit 0 of row 0 is not finite (nan)" \
    eval -m "$M" --tokens 1,2,3 --reference "$TMP/nan.f32"
printf '1 2 3\n' >"$TMP/three.tok"
check "perplexity --reference-logits with a NaN logit names it" 1 err "logit 0 of row 0 is not finite (nan)" \
    perplexity -m "$M" --tokens-file "$TMP/three.tok" --reference-logits "$TMP/nan.f32"
if [ -w /dev/full ]; then
    "$LILY" eval -m "$M" --tokens 1,2 >/dev/full 2>"$TMP/err"; rc=$?
    expect "eval writing to a full device fails (exit 1)" bash -c "[ $rc = 1 ] && grep -qF 'error writing the output' '$TMP/err'"
    # so does the top level's own output (--help and --version exited 0 having written nothing), and lily help CMD's
    for args in "--help" "--version" "help" "help run"; do
        "$LILY" $args >/dev/full 2>"$TMP/err"; rc=$?
        expect "lily $args writing to a full device fails (exit 1)" \
            bash -c "[ $rc = 1 ] && grep -qF 'error writing the output' '$TMP/err'"
    done
fi

# --- info / eval / perplexity without -m: $LILY_MODEL, the same results as with -m ------------------
printf 'The Python interpreter is usually installed as a program on the machine.\n' >"$TMP/text.txt"
same_as_m() { # name, lily args (without -m)...
    local name=$1; shift
    "$LILY" "$@" -m "$M" >"$TMP/with_m" 2>/dev/null; local rc1=$?
    LILY_MODEL="$M" "$LILY" "$@" >"$TMP/env_out" 2>"$TMP/env_err"; local rc2=$?
    if [ "$rc1" = 0 ] && [ "$rc2" = 0 ] && grep -qF 'no -m given; using $LILY_MODEL' "$TMP/env_err" &&
       diff <(grep -v "tok/s" "$TMP/with_m") <(grep -v "tok/s" "$TMP/env_out") >/dev/null; then
        ok "$name"
    else
        fail "$name (rc $rc1/$rc2; $(head -c 300 "$TMP/env_err"))"
    fi
}
same_as_m "info without -m uses \$LILY_MODEL" info
same_as_m "eval without -m uses \$LILY_MODEL" eval --tokens 1,2,3,4
same_as_m "perplexity without -m uses \$LILY_MODEL" perplexity -f "$TMP/text.txt"
expect "the perplexity line is there" grep -q "^perplexity: [0-9]" "$TMP/env_out"

# --- bench: default sweep up to max_position_embeddings; a warning past it --------------------------
mkdir "$TMP/short"
for f in "$M"/*; do ln -s "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" "$TMP/short/"; done
rm "$TMP/short/config.json"
sed 's/"max_position_embeddings": [0-9]*/"max_position_embeddings": 600/' "$M/config.json" >"$TMP/short/config.json"
"$LILY" bench -m "$TMP/short" -n 4 -r 1 --no-warmup -o csv >"$TMP/bench.csv" 2>"$TMP/bench.err"; rc=$?
tests=$(tail -n +2 "$TMP/bench.csv" | cut -d, -f1 | tr '\n' ' ')
expect "bench default sweep stops at max_position_embeddings 600 (got: $tests)" \
    test "$rc:$tests" = "0:pp256 pp512 tg4 @ d256 tg4 @ d512 "
expect "bench default sweep gives no length warning" bash -c "! grep -q warning '$TMP/bench.err'"
"$LILY" bench -m "$TMP/short" -p 700 -d 598 -n 4 -r 1 --no-warmup -o csv >"$TMP/bench.csv" 2>"$TMP/bench.err"; rc=$?
expect "bench -p 700 past max_position_embeddings warns and still measures" bash -c "[ $rc = 0 ] &&
    grep -qF 'warning: prompt length 700 is beyond the model'\''s max_position_embeddings 600' '$TMP/bench.err' &&
    grep -qF 'warning: depth 598 + 4 decode tokens is beyond' '$TMP/bench.err' && grep -q '^pp700,' '$TMP/bench.csv'"
# --sampling and --device are the CUDA backend's: on the cpu a line says so, and --sampling gives one decode row
# per depth, not rows labelled qwen / logprobs that all timed the same unsampled forward passes
"$LILY" bench -m "$M" -p none -d 16 -n 2 -r 1 --no-warmup --sampling qwen,logprobs -o csv >"$TMP/bench.csv" 2>"$TMP/bench.err"; rc=$?
tests=$(tail -n +2 "$TMP/bench.csv" | cut -d, -f1 | tr '\n' ' ')
expect "bench --sampling on the cpu says it applies to cuda only and measures one row (got: $tests)" bash -c "[ $rc = 0 ] &&
    grep -qF 'lily bench: --sampling applies to --backend cuda only' '$TMP/bench.err' && [ '$tests' = 'tg2 @ d16 ' ]"
check "bench --device on the cpu says it is ignored" 0 err "lily bench: --device applies to --backend cuda only" \
    bench -m "$M" -p 8 -n 0 -r 1 --no-warmup --device 1 -o csv
# options that contradict each other are a usage error naming both, in either order (the last one won silently)
# (timeout: without the check, serve would start serving)
CHECK_PREFIX="timeout 30"
for cmd in "run -p hi -n 1" "chat -n 1" "serve --port 0" "bench -p 8 -n 0 -r 1 --no-warmup -o csv"; do
    # shellcheck disable=SC2086
    check "$cmd: --cpu-moe then --n-cpu-moe conflict" 2 err "--cpu-moe and --n-cpu-moe conflict" \
        ${cmd%% *} -m "$M" ${cmd#"${cmd%% *}"} --cpu-moe --n-cpu-moe 2
    # shellcheck disable=SC2086
    check "$cmd: --n-cpu-moe=2 then --cpu-moe conflict" 2 err "--n-cpu-moe and --cpu-moe conflict" \
        ${cmd%% *} -m "$M" ${cmd#"${cmd%% *}"} --n-cpu-moe=2 --cpu-moe
done
check "serve --no-think with --reasoning on conflict" 2 err "lily serve: --no-think and --reasoning on conflict" \
    serve -m "$M" --port 0 --no-think --reasoning on
check "serve --reasoning on then --no-think conflict" 2 err "lily serve: --no-think and --reasoning on conflict" \
    serve -m "$M" --port 0 --reasoning=on --no-think
CHECK_PREFIX=
finish
